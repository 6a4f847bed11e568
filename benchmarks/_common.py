"""Helpers shared by the issue-4 comparison benchmarks (scaffold_shards.py,
fedbn_shift.py, server_optimizers.py): where a benchmark keeps its runs, one run
condensed to a JSON record (run, reused or resumed), the exact settings, and the
``RESULT`` line.

A full benchmark keeps its run stores under ``benchmarks/out/runs/<bench>`` and
one record per run under ``benchmarks/results/<bench>`` (tracked). Rerunning the
same command reuses every recorded run whose config is unchanged, and resumes a
run that was stopped (SIGINT/SIGTERM/killed) from its last checkpoint
(``fedforge.server.sweep.run_point``). ``--quick`` runs everything afresh in a temporary
directory, so a smoke run always exercises the code.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedforge.config import Config, from_dict, to_dict
from fedforge.core.errors import ConfigError
from fedforge.data.federated import FederatedData
from fedforge.evaluation.metrics import rounds_to_target
from fedforge.evaluation.validation import VALIDATION_ACCURACY
from fedforge.server.sweep import run_point
from fedforge.store import RunStore
from fedforge.store.edited import flat_fields

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Places:
    """Where a benchmark's run stores and per-run records go."""

    runs: Path
    records: Path


def places(bench: str, quick: bool) -> Places:
    """Tracked records and resumable run stores for a full run; a fresh temporary
    directory for ``--quick``."""
    if quick:
        tmp = Path(tempfile.mkdtemp(prefix=f"{bench}-quick-"))
        return Places(tmp / "runs", tmp / "records")
    return Places(
        ROOT / "benchmarks" / "out" / "runs" / bench, ROOT / "benchmarks" / "results" / bench
    )


def add_workers(parser: argparse.ArgumentParser) -> None:
    """``--workers``: processes per run (0: one per core, the full default; ``--quick``
    runs in one process, to stay on one core). SCAFFOLD and FedBN keep per-client
    state and stay in one process whatever this says."""
    parser.add_argument("--workers", type=int, help="processes per run (default 0; quick: 1)")


def workers(args: argparse.Namespace) -> int:
    """The ``--workers`` value, or its default for the mode."""
    return int(args.workers) if args.workers is not None else (1 if args.quick else 0)


def _comparable(cfg: Config) -> dict[str, Any]:
    """The config as it decides the result: not where runs and data are kept, nor
    over how many processes the cohort was spread (engines decide where a client
    runs, never what it computes; the record says which engine ran)."""
    d = to_dict(cfg)
    for where in ("runs_dir", "data_dir", "workers"):
        d.pop(where, None)
    return d


def _same_config(stored: Any, cfg: Config) -> bool:
    """Whether a record's stored config is ``cfg``'s, read through today's schema
    (a field added since the record was written takes its default, so that it
    does not make every record stale)."""
    if not isinstance(stored, dict):
        return False  # no config in the record: recompute
    try:
        return _comparable(from_dict(stored)) == _comparable(cfg)
    except ConfigError:
        return False  # not a config today's schema reads: recompute


def differences(cfg: Config, base: Config) -> dict[str, Any]:
    """``cfg``'s fields (dotted: ``partition.kind``) that differ from ``base``'s."""
    mine, other = flat_fields(_comparable(cfg)), flat_fields(_comparable(base))
    return {k: v for k, v in mine.items() if other.get(k) != v and k != "name"}


def print_settings(title: str, shared: Config, arms: dict[str, Config]) -> None:
    """The benchmark's exact settings: what the ``shared`` config sets apart from
    fedforge's defaults, then what each arm changes from ``shared``."""
    print(title)
    base = differences(shared, Config())
    print(
        "shared (all else fedforge's defaults): " + ", ".join(f"{k}={v}" for k, v in base.items())
    )
    for arm, cfg in arms.items():
        own = differences(cfg, shared)
        print(f"  {arm}: " + (", ".join(f"{k}={v}" for k, v in own.items()) or "(shared only)"))
    print(f"torch threads: {torch.get_num_threads()}", flush=True)


def run_record(
    cfg: Config, data: FederatedData, places: Places, target: float | None = None
) -> dict[str, Any]:
    """Run ``cfg`` (or reuse its record, or resume its stopped run) and return its
    record: the evaluation curve, rounds to ``target`` (the config's target when
    None), final and best test accuracy, wall time, engine, clients that trained,
    and the last evaluation round's per-client rows when ``evaluation.clients`` is on."""
    places.records.mkdir(parents=True, exist_ok=True)
    path = places.records / f"{cfg.name}.json"
    target = cfg.target_accuracy if target is None else target
    if path.exists():
        rec: dict[str, Any] = json.loads(path.read_text())
        if _same_config(rec.get("config"), cfg) and rec.get("target") == target:
            rec["status"] = "reused"
            return rec
    t0 = time.perf_counter()
    point = run_point(cfg, {}, data, progress=False)  # runs, reuses or resumes (server/sweep.py)
    if point.status == "failed" or point.run_dir is None:
        raise SystemExit(f"{cfg.name}: stopped by a signal; rerun the same command to resume")
    rec = _read(point.run_dir, cfg, target)
    rec["status"] = point.status
    rec["seconds_this_call"] = time.perf_counter() - t0
    path.write_text(json.dumps(rec, indent=1))
    return rec


def run_arms(
    arms: list[str], config: Any, args: argparse.Namespace, data_of: str
) -> list[tuple[str, int, dict[str, Any]]]:
    """Each arm's record for each of ``args.seeds`` seeds (``config(arm, seed,
    args)``), on the data of arm ``data_of``'s config, a line printed per run."""
    from fedforge.data.federated import load_federated_data

    rows: list[tuple[str, int, dict[str, Any]]] = []
    for seed in range(args.seeds):
        data = load_federated_data(config(data_of, seed, args))
        for arm in arms:
            rec = run_record(config(arm, seed, args), data, args.places)
            rows.append((arm, seed, rec))
            print(
                f"{arm} seed {seed}: rounds to target {fmt(rec['rounds_to_target'])}, "
                f"final acc {fmt(rec['final_accuracy'], '.4f')} ({rec['status']})",
                flush=True,
            )
    return rows


def mean_of(xs: list[Any]) -> float:
    """The mean of ``xs``; NaN when empty or when one is None (a target not reached)."""
    return sum(xs) / len(xs) if xs and None not in xs else math.nan


def _read(run_dir: Path, cfg: Config, target: float | None) -> dict[str, Any]:
    with RunStore.open(run_dir) as store:
        rounds = store.rounds()
        summary = store.summary() or {}
        seen = sorted({c.client_id for c in store.client_rounds()})
        client_eval = store.read_rows("client_eval")
        validation = validation_curve(store)
    evals = [(r.round_idx + 1, r.test_accuracy) for r in rounds if r.test_accuracy is not None]
    xs, accs = [e[0] for e in evals], [float(e[1]) for e in evals]
    # with evaluation.validation on, rounds to target read the validation curve
    reach = ([x for x, _ in validation], [a for _, a in validation]) if validation else (xs, accs)
    last_eval = max((row[0] for row in client_eval), default=None)
    return {
        "config": _comparable(cfg),
        "run_dir": str(run_dir),
        "rounds_done": len(rounds),
        "target": target,
        "rounds_to_target": rounds_to_target(*reach, target) if target is not None else None,
        "target_read": "validation" if validation else "test",
        "validation_curve": validation,
        "final_accuracy": accs[-1] if accs else None,
        "best_accuracy": max(accs) if accs else None,
        "curve": evals,
        "wall_seconds": summary.get("wall_seconds"),
        "engine": summary.get("engine"),
        "clients_trained": seen,
        "client_eval_round": last_eval,
        "client_eval": [list(r[1:]) for r in client_eval if r[0] == last_eval],
    }


def validation_curve(store: RunStore) -> list[tuple[int, float]]:
    """(round, validation accuracy) of each evaluation of a run with
    ``evaluation.validation`` on (empty without)."""
    got = store.read_rows("eval_metrics")
    return [(int(r) + 1, float(v)) for r, name, v in got if name == VALIDATION_ACCURACY]


def claim(record: Path) -> bool:
    """Take the right to compute ``record`` (a cell's result file) for this process,
    so that two processes splitting a benchmark never compute the same cell: False
    while another live process holds it. A claim left by a dead process is taken
    over; :func:`release` drops it once the record is written."""
    marker = record.with_suffix(".claim")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(marker.read_text() or 0), 0)
            return False  # its holder is alive
        except (ProcessLookupError, ValueError, FileNotFoundError):
            marker.unlink(missing_ok=True)
            return claim(record)
    with os.fdopen(fd, "w") as fh:
        fh.write(str(os.getpid()))
    return True


def save_record(record: Path, value: Any) -> None:
    """Write ``value`` as JSON to ``record`` atomically (temp file + rename: a
    stopped run never leaves half a record) and drop this process's claim."""
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(record)
    record.with_suffix(".claim").unlink(missing_ok=True)


def seconds_per_round(rec: dict[str, Any]) -> float:
    """The run's wall seconds over its rounds (evaluation included)."""
    wall = rec.get("wall_seconds")
    return float(wall) / rec["rounds_done"] if wall and rec["rounds_done"] else math.nan


def ratio(num: float | None, den: float | None) -> float:
    """num / den, NaN when either is missing (a target not reached)."""
    return num / den if num is not None and den else math.nan


def fmt(x: float | None, spec: str = ".1f") -> str:
    """A table cell: ``-`` for a missing value."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def result_line(fields: dict[str, Any]) -> str:
    """``RESULT k=v ...``: floats to 4 decimals, missing values as nan."""
    parts = []
    for k, v in fields.items():
        if v is None:
            v = math.nan
        parts.append(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}")
    return "RESULT " + " ".join(parts)


def machine() -> dict[str, Any]:
    """The machine a benchmark ran on, and its load when it started."""
    cpu = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln]
    return {
        "nproc": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "cpu": cpu[0].split(":", 1)[1].strip() if cpu else platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg": os.getloadavg(),
    }


def central_baseline(records: Path = ROOT / "benchmarks" / "results" / "table1") -> str:
    """The centralised baseline's line for a report: the same model trained on all
    the training data on one machine (mcmahan_table1.py --central), its test
    accuracy after each epoch; empty when it has not been run."""
    lines = []
    for path in sorted(records.glob("table1_central_*.json")):
        rec = json.loads(path.read_text())
        cfg = rec["config"]
        accs = " ".join(f"{a:.4f}" for _, a in rec["curve"])
        lines.append(
            f"centralised {cfg['model']} (all training data on one machine, B = "
            f"{cfg['batch_size']}, lr {cfg['lr']:g}): test accuracy after epochs 1.."
            f"{rec['rounds_done']}: {accs}"
        )
    return "\n".join(lines)
