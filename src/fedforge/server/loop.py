"""The round loop (McMahan et al. 2017, Algorithm 1, server side).

Each round: sample the cohort, encode the payload, let the engine run the
clients, decode and check every update, aggregate, step the server optimizer,
evaluate every ``eval_every`` rounds, record the round. Stops at the target
accuracy or after ``rounds``. Runs on the server; trusts nothing it decodes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedforge.client import ClientTask
from fedforge.config import Config
from fedforge.data import PartitionSummary, summarize
from fedforge.data.mnist import NUM_CLASSES
from fedforge.errors import UploadError
from fedforge.evaluate import evaluate
from fedforge.experiment import Experiment, FederatedData, build
from fedforge.metrics import rounds_to_target
from fedforge.pipeline import StageContext
from fedforge.report.progress import Progress, format_bytes
from fedforge.server.optimizers import ServerSGD
from fedforge.server.sampling import sample_cohort
from fedforge.store import ClientRecord, RoundRecord, RunStore
from fedforge.transport import wire


@dataclass
class RunResult:
    """What a finished run hands back to Python callers."""

    params: torch.Tensor
    rounds: list[RoundRecord]
    summary: dict[str, Any]
    run_dir: Path | None = None
    rejected: list[tuple[int, int, str]] = field(default_factory=list)  # round, client, why


@dataclass
class _Upload:
    client_id: int
    delta: torch.Tensor
    num_examples: int
    train_loss: float
    nbytes: int


def _check_update(exp: Experiment, client_id: int, round_idx: int, data: bytes) -> _Upload:
    """Decode one update and refuse anything that is not a well-formed delta."""
    msg = wire.decode(data)
    delta = msg.tensors.get("delta")
    if delta is None:
        raise UploadError("update carries no 'delta' tensor")
    if tuple(delta.shape) != (exp.spec.size,) or delta.dtype != exp.initial_params.dtype:
        raise UploadError(
            f"delta has shape {tuple(delta.shape)} and dtype {delta.dtype}; "
            f"expected ({exp.spec.size},) {exp.initial_params.dtype}"
        )
    n = msg.meta.get("num_examples")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UploadError(f"num_examples {n!r} must be a positive integer")
    if msg.meta.get("client_id") != client_id or msg.meta.get("round_idx") != round_idx:
        raise UploadError(
            f"update is labelled client {msg.meta.get('client_id')!r} round "
            f"{msg.meta.get('round_idx')!r}; expected client {client_id} round {round_idx}"
        )
    loss = msg.meta.get("train_loss")
    return _Upload(
        client_id, delta, n, float(loss) if loss is not None else float("nan"), len(data)
    )


def run(
    cfg: Config,
    data: FederatedData | None = None,
    progress: bool = False,
    store: bool = True,
) -> RunResult:
    """Run ``cfg`` to its target or its last round; record it in a run store."""
    exp = build(cfg, data)
    partition = summarize(exp.data.partition, exp.data.train_y.numpy(), NUM_CLASSES)
    if progress:
        print(f"partition: {partition.format()}", flush=True)
        if exp.note:
            print(exp.note, flush=True)
    run_store = RunStore.create(cfg.runs_dir, cfg) if store else None
    if run_store is not None:
        _write_partition(run_store.path / "partition.json", partition)
    try:
        result = _rounds(exp, run_store, progress)
    except BaseException as exc:
        if run_store is not None:
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
            run_store.finish({"error": f"run stopped: {why}"}, status="failed")
            run_store.close()
        raise
    result.summary["heterogeneity"] = partition.heterogeneity
    if run_store is not None:
        torch.save({"params": result.params, "names": exp.spec.names}, _tmp(run_store.path))
        _tmp(run_store.path).replace(run_store.path / "final_params.pt")
        result.run_dir = run_store.path
        result.summary["run_dir"] = str(run_store.path)
        run_store.finish(result.summary)
        run_store.close()
    return result


def _write_partition(path: Path, summary: PartitionSummary) -> None:
    """Sizes and per-client label histograms beside the store, for reports."""
    data = {
        "heterogeneity": summary.heterogeneity,
        "sizes": summary.sizes.tolist(),
        "label_counts": summary.label_counts.tolist(),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _tmp(run_dir: Path) -> Path:
    return run_dir / "final_params.pt.tmp"


def _rounds(exp: Experiment, run_store: RunStore | None, show: bool) -> RunResult:
    cfg = exp.cfg
    params = exp.initial_params.clone()
    optimizer = ServerSGD(exp.algorithm.server_lr)
    itemsize = params.element_size()
    records: list[RoundRecord] = []
    rejected: list[tuple[int, int, str]] = []
    bar = Progress(cfg.rounds, cfg.name, enabled=show)
    start = time.perf_counter()
    total_bytes = 0
    evals: tuple[list[float], list[float]] = ([], [])
    for round_idx in range(cfg.rounds):
        t0 = time.perf_counter()
        cohort = sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, round_idx)
        plan = exp.algorithm.plan(round_idx)
        payload = wire.encode({"params": params}, {"round_idx": round_idx})
        tasks = [ClientTask(c, round_idx, plan, cfg.seed) for c in cohort]
        acc = exp.pipeline.aggregator.start(exp.spec.size, params.dtype)
        clients: list[ClientRecord] = []
        losses: list[tuple[float, int]] = []
        for upload in exp.engine.run_cohort(tasks, payload):
            try:
                up = _check_update(exp, upload.client_id, round_idx, upload.data)
            except UploadError as exc:
                rejected.append((round_idx, upload.client_id, str(exc)))
                bar.write(f"round {round_idx}: update of client {upload.client_id} rejected: {exc}")
                continue
            ctx = StageContext(round_idx, cfg.seed, up.client_id)
            delta = exp.pipeline.run_upload(up.delta, ctx)
            acc.add(delta, float(up.num_examples))
            losses.append((up.train_loss, up.num_examples))
            clients.append(
                ClientRecord(
                    round_idx,
                    up.client_id,
                    up.num_examples,
                    up.train_loss,
                    float(delta.norm()),
                    up.nbytes,
                    len(payload),
                )
            )
        if acc.count:
            aggregate = exp.pipeline.run_aggregate(acc.result(), StageContext(round_idx, cfg.seed))
            params = optimizer.step(params, aggregate)
        else:
            bar.write(f"round {round_idx}: no valid update; the global model is unchanged")
        test_acc = test_loss = None
        last = round_idx == cfg.rounds - 1
        if (round_idx + 1) % cfg.eval_every == 0 or last:
            ev = evaluate(
                exp.model, exp.spec, params, exp.data.test_x, exp.data.test_y, cfg.eval_batch_size
            )
            test_acc, test_loss = ev.accuracy, ev.loss
            evals[0].append(round_idx + 1)
            evals[1].append(ev.accuracy)
        seen = sum(n for _, n in losses)
        record = RoundRecord(
            round_idx=round_idx,
            cohort_size=len(cohort),
            train_loss=sum(loss * n for loss, n in losses) / seen if seen else float("nan"),
            test_accuracy=test_acc,
            test_loss=test_loss,
            bytes_up=sum(c.bytes_up for c in clients),
            bytes_down=len(payload) * len(cohort),
            paper_bytes=2 * exp.spec.size * len(cohort) * itemsize,
            lr=plan.lr,
            seconds=time.perf_counter() - t0,
        )
        records.append(record)
        total_bytes += record.bytes_up + record.bytes_down
        if run_store is not None:
            run_store.record_round(record, clients)
        bar.update(test_acc, test_loss, total_bytes)
        target = cfg.target_accuracy
        if target is not None and test_acc is not None and max(evals[1]) >= target:
            break
    bar.close()
    summary = _summary(exp, records, evals, time.perf_counter() - start)
    return RunResult(params, records, summary, rejected=rejected)


def _summary(
    exp: Experiment,
    records: list[RoundRecord],
    evals: tuple[list[float], list[float]],
    seconds: float,
) -> dict[str, Any]:
    cfg = exp.cfg
    target = cfg.target_accuracy
    rtt = rounds_to_target(evals[0], evals[1], target) if target is not None else None
    final = next((r for r in reversed(records) if r.test_accuracy is not None), None)
    return {
        "rounds_done": len(records),
        "target_accuracy": target,
        "rounds_to_target": rtt,
        "best_accuracy": max(evals[1]) if evals[1] else None,
        "final_accuracy": final.test_accuracy if final else None,
        "final_loss": final.test_loss if final else None,
        "bytes_up": sum(r.bytes_up for r in records),
        "bytes_down": sum(r.bytes_down for r in records),
        "paper_bytes": sum(r.paper_bytes for r in records),
        "wall_seconds": seconds,
        "num_params": exp.spec.size,
        "pipeline": exp.pipeline.describe(),
        "engine": exp.engine.name,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run lines the CLI prints."""
    rtt = summary.get("rounds_to_target")
    target = summary.get("target_accuracy")
    reached = (
        f"{rtt:.1f} rounds to {100 * target:.1f}%"
        if rtt is not None and target is not None
        else ("target not reached" if target is not None else "no target")
    )
    best = summary.get("best_accuracy")
    best_txt = "-" if best is None else f"{100 * best:.2f}%"
    lines = [
        f"rounds done      {summary['rounds_done']} ({reached}); best accuracy {best_txt}",
        f"bytes up / down  {format_bytes(summary['bytes_up'])} / "
        f"{format_bytes(summary['bytes_down'])} "
        f"(paper estimate 2|w|Kb: {format_bytes(summary['paper_bytes'])})",
        f"wall time        {summary['wall_seconds']:.1f} s",
    ]
    if summary.get("run_dir"):
        lines.append(f"run files        {summary['run_dir']}")
    return "\n".join(lines)
