"""A run's summary (what ``RunResult.summary`` and the run store hold) and the
end-of-run lines the CLI prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedforge.evaluation.metrics import bytes_at, rounds_to_target, seconds_at
from fedforge.evaluation.participation import participation
from fedforge.report.facts import run_facts
from fedforge.report.progress import format_bytes, score_text
from fedforge.selection.history import NEVER, History
from fedforge.server.experiment import Experiment
from fedforge.store import RoundRecord


def summarize_run(
    exp: Experiment,
    records: list[RoundRecord],
    evals: tuple[list[int], list[float]],
    seconds: float,
    privacy_state: dict[str, Any] | None = None,
    history: History | None = None,
    virtual_s: Sequence[float] = (),
) -> dict[str, Any]:
    """Rounds done, rounds to target (from the evaluation history), bytes, wall time;
    privacy spent by the participation ``privacy_state`` recorded; how the cohorts
    spread over the clients (``history``: what the server knew of each one); with
    the virtual clock (``virtual_s``: each round's end), the virtual time in all
    and to the target."""
    cfg = exp.cfg
    target = cfg.target_accuracy
    rtt = rounds_to_target(evals[0], evals[1], target) if target is not None else None
    final = next((r for r in reversed(records) if r.test_accuracy is not None), None)
    up = [r.bytes_up for r in records]
    both = [r.bytes_up + r.bytes_down for r in records]
    # dense float32 bytes of the messages that travelled; a round from an older
    # store lacks them: its paper estimate, half each way, stands in
    dense_up = sum(r.paper_bytes / 2 if r.float32_up is None else r.float32_up for r in records)
    dense_down = sum(
        r.paper_bytes / 2 if r.float32_down is None else r.float32_down for r in records
    )
    return {
        "rounds_done": len(records),
        "target_accuracy": target,
        "rounds_to_target": rtt,
        "score_name": exp.metrics.score_name,  # what best/final_accuracy hold
        "best_accuracy": max(evals[1]) if evals[1] else None,
        "final_accuracy": final.test_accuracy if final else None,
        "final_loss": final.test_loss if final else None,
        "bytes_up": sum(r.bytes_up for r in records),
        "bytes_down": sum(r.bytes_down for r in records),
        "paper_bytes": sum(r.paper_bytes for r in records),
        # compression: dense float32 bytes of the same messages over the real bytes
        "uplink_ratio": dense_up / sum(up) if sum(up) else None,
        "downlink_ratio": dense_down / (sum(both) - sum(up)) if sum(both) > sum(up) else None,
        "bytes_to_target": bytes_at(rtt, both) if rtt is not None else None,
        "bytes_up_to_target": bytes_at(rtt, up) if rtt is not None else None,
        "wall_seconds": seconds,
        "num_params": exp.spec.size,
        "pipeline": exp.pipeline.describe(),
        "engine": exp.engine.name,
        **(_virtual(virtual_s, rtt) if virtual_s else {}),
        **(
            {"attackers": sorted(exp.robust.attackers)}
            if exp.robust and exp.robust.attackers
            else {}
        ),
        **(
            {"privacy": exp.privacy.summary(len(records), privacy_state)}
            if exp.privacy is not None
            else {}
        ),
        **({"participation": _participation(exp, history)} if history is not None else {}),
    }


def _participation(exp: Experiment, history: History) -> dict[str, Any]:
    n = exp.cfg.num_clients
    asked, used = history.column("asked", n), history.column("used", n)
    first = history.column("first_asked", n)
    return participation(
        n, _by_id(asked, asked != 0), _by_id(used, used != 0), _by_id(first, first != NEVER)
    )


def _by_id(values: np.ndarray, kept: np.ndarray) -> dict[int, int]:
    """The ``kept`` entries of a history column by client id."""
    ids = np.flatnonzero(kept)
    return dict(zip(ids.tolist(), values[ids].tolist(), strict=True))


def _virtual(ends: Sequence[float], rtt: float | None) -> dict[str, Any]:
    """The virtual seconds of the run, and to its target (interpolated within the
    round that reached it, as rounds to target are)."""
    durations = [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]
    return {
        "virtual_seconds": float(ends[-1]),
        "virtual_seconds_to_target": seconds_at(rtt, durations) if rtt is not None else None,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run lines the CLI prints."""
    rtt = summary.get("rounds_to_target")
    target = summary.get("target_accuracy")
    score = summary.get("score_name", "accuracy")  # what the task scores by
    goal = f"R^2 {target}" if score == "R^2" else f"{100 * (target or 0):.1f}%"
    reached = (
        f"{rtt:.1f} rounds to {goal}"
        if rtt is not None and target is not None
        else ("target not reached" if target is not None else "no target")
    )
    best = score_text(summary.get("best_accuracy"), score)
    lines = [
        f"rounds done      {summary['rounds_done']} ({reached}); best {score} {best}",
        f"bytes up / down  {format_bytes(summary['bytes_up'])} / "
        f"{format_bytes(summary['bytes_down'])} "
        f"(paper estimate 2|w|Kb: {format_bytes(summary['paper_bytes'])})",
    ]
    to_target = summary.get("bytes_to_target")
    if to_target is not None:
        lines.append(
            f"bytes to target  {format_bytes(to_target)} "
            f"(up {format_bytes(summary['bytes_up_to_target'])})"
        )
    lines.append(f"wall time        {summary['wall_seconds']:.1f} s")
    lines += [f"{label:<17}{text}" for label, text in run_facts(summary)]
    if summary.get("run_dir"):
        lines.append(f"run files        {summary['run_dir']}")
    return "\n".join(lines)
