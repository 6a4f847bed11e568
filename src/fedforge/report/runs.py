"""What a person sees of stored runs: the ``fedforge runs`` table and the
``fedforge show RUN`` summary."""

from __future__ import annotations

from typing import Any

from fedforge.config import describe_split, describe_task, step_sizes
from fedforge.evaluation.clients import summarize_accuracies
from fedforge.report.facts import run_facts
from fedforge.report.headline import headline
from fedforge.report.progress import count, format_bytes, named_score, percent, score_text
from fedforge.store.runs_dir import live_status
from fedforge.store.runstore import RunInfo, RunStore


def _fmt_seconds(s: float) -> str:
    minutes, sec = divmod(round(s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {sec:02d}s" if hours else f"{minutes}m {sec:02d}s"


RUN_COLUMNS = ("RUN", "STATUS", "ALGORITHM", "MODE", "ROUNDS", "BEST", "CREATED")


def run_mode(r: RunInfo) -> str:
    """``deployment`` for a run of `fedforge server`, else ``sim``."""
    return "deployment" if r.deployment else "sim"


def run_row(r: RunInfo) -> tuple[str, ...]:
    """One run's line of ``fedforge runs`` (and of the dashboard's list), as texts
    under :data:`RUN_COLUMNS`; the best score named (``acc 95.12%``, ``R^2 0.33``)."""
    done = f"{r.rounds_done}/{r.rounds_planned or '?'}"
    best = named_score(r.best_accuracy, r.score_name)
    return (r.run_id, r.status, r.algorithm or "-", run_mode(r), done, best, r.created)


def format_run_table(runs: list[RunInfo]) -> str:
    """The table printed by ``fedforge runs``."""
    if not runs:
        return "no runs"
    rows = [RUN_COLUMNS, *(run_row(r) for r in runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(RUN_COLUMNS))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def format_run_summary(store: RunStore) -> str:
    """The text printed by ``fedforge show RUN``."""
    info, cfg, rounds = store.info(), store.config(), store.rounds()
    status = live_status(store.path, info.status)
    summary = store.summary() or {}
    batch = "all" if cfg.batch_size is None else cfg.batch_size
    lines = [
        f"run       {info.run_id}  [{status}]",
        f"path      {store.path}",
        f"created   {info.created}",
        f"config    {cfg.algorithm} {describe_task(cfg)}, {cfg.num_clients} clients, "
        f"{run_mode(info)}, "
        f"{describe_split(cfg)}",
        f"          C={cfg.client_fraction} E={cfg.local_epochs} B={batch} {step_sizes(cfg)} "
        f"seed={cfg.seed} engine={cfg.engine} dtype={cfg.dtype}",
        f"rounds    {len(rounds)} of {cfg.rounds}",
    ]
    head = headline(rounds, summary)
    best, last = head.best, head.final
    score = info.score_name
    lines.append(
        f"{score:<9} best {score_text(best.test_accuracy, score)} (round {best.round_idx + 1}), "
        f"final {score_text(last.test_accuracy, score)} (round {last.round_idx + 1})"
        if best and last
        else f"{score:<9} not evaluated"
    )
    target = summary.get("target_accuracy", cfg.target_accuracy)
    if "rounds_to_target" in summary and isinstance(target, int | float):
        reached = summary["rounds_to_target"]
        ok = isinstance(reached, int | float)
        result = f"reached in {reached:.1f} rounds" if ok else "not reached"
        lines.append(f"target    {target}: {result}")
    lines.append(
        f"bytes     up {format_bytes(head.bytes_up)}, down {format_bytes(head.bytes_down)}"
    )
    lines.append(f"wall time {_fmt_seconds(head.wall_seconds)}")
    lines.extend(noniid_lines(store))
    lines += [f"{label:<9} {text}" for label, text in run_facts(summary)]
    anomalies = store.anomalies()
    refused = {a.client_id for a in anomalies if a.client_id is not None}
    skipped = sum(a.client_id is None for a in anomalies)
    if anomalies:
        lines.append(
            f"anomalies {len(anomalies) - skipped} updates refused ({len(refused)} clients), "
            f"{skipped} rounds skipped (the anomalies table says why)"
        )
    if info.status in ("failed", "stopped") and summary.get("error"):
        lines.append(f"stopped   {summary['error']}")
    if status == "died":
        lines.append(
            f"stopped   killed (no process holds it); resume with: fedforge resume {store.path}"
        )
    return "\n".join(lines)


def _last(rows: list[tuple[Any, ...]]) -> tuple[int, list[tuple[Any, ...]]]:
    """The rows of the last stored round, and that round counted from 1 (rows
    carry round_idx, from 0)."""
    last = max(r[0] for r in rows)
    return last + 1, [r for r in rows if r[0] == last]


def _mean(values: list[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def noniid_lines(store: RunStore) -> list[str]:
    """Per-client evaluation, per-class accuracy and drift diagnostics of the last
    round that has them (none when the run did not record them)."""
    lines = []
    evals = store.read_rows("client_eval")
    if evals:
        at, rows = _last(evals)
        accs = {int(r[1]): float(r[2]) for r in rows if r[2] is not None}
        lines.append(f"clients   round {at}: {summarize_accuracies(accs).format()}")
    personal = store.read_rows("personal_eval")
    if personal:  # each client after its own local steps (personal.py)
        at, rows = _last(personal)
        accs = {int(r[1]): float(r[2]) for r in rows if r[2] is not None}
        lines.append(f"personal  round {at}: {summarize_accuracies(accs).format()}")
    groups = store.read_rows("group_eval")
    if groups:  # each population group of clients (evaluation/groups.py)
        at, rows = _last(groups)
        for attribute in dict.fromkeys(r[1] for r in rows):
            text = ", ".join(
                f"{r[2]} {percent(r[3])} ({count(r[6], 'client')})"
                for r in rows
                if r[1] == attribute
            )
            lines.append(f"groups    round {at}: {attribute}: {text}")
    classes = store.read_rows("class_accuracy")
    if classes:
        at, rows = _last(classes)
        text = " ".join(f"{r[1]}:{r[2]:.3f}" for r in rows if r[2] is not None)
        lines.append(f"classes   round {at}: {text}")
    diag = store.read_rows("diagnostics")
    if diag:
        at, rows = _last(diag)
        _, _, cos, median, top, ratio = rows[0]
        cosines = [r[2] for r in diag if r[2] is not None]  # a skipped round has none
        avg = _mean(cosines)
        cos_text = "-" if cos is None else f"{cos:.3f}"
        avg_text = "-" if avg is None else f"{avg:.3f}"
        norms = (
            f"update norm median {median:.4g} max {top:.4g} (max/median {ratio:.3g})"
            if median is not None and top is not None and ratio is not None
            else "update norms -"
        )
        lines.append(
            f"drift     round {at}: mean cosine {cos_text} (mean over "
            f"{count(len(cosines), 'round')} {avg_text}), {norms}"
        )
    gaps = store.read_rows("client_gaps")
    if gaps:
        at, rows = _last(gaps)
        gap = _mean([r[4] for r in rows])
        if gap is not None:
            lines.append(
                f"loss gap  round {at}: global - local loss on the cohort's data, mean {gap:.4f}"
            )
    return lines
