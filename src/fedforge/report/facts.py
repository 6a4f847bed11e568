"""The facts of a finished run that its end-of-run lines and ``fedforge show``
both print, from its summary alone: what ran (pipeline, engine), compression
against float32, the virtual clock's time, the simulated attackers, privacy
spent, how the cohorts spread over the clients, why it stopped early.
Each is a (label, text) pair, labels of at most 9 characters; the caller pads
them to its own column."""

from __future__ import annotations

from typing import Any

from fedforge.evaluation.participation import participation_line
from fedforge.report.progress import format_duration

Fact = tuple[str, str]
# the summary's keys saying why a run ended before its last round (server/stops.py)
EARLY_STOPS = ("privacy_stop", "byte_stop", "stall_stop")


def run_facts(summary: dict[str, Any]) -> list[Fact]:
    facts: list[Fact] = []
    if summary.get("pipeline"):
        engine = f" ({summary['engine']} engine)" if summary.get("engine") else ""
        facts.append(("pipeline", f"{summary['pipeline']}{engine}"))
    up, down = summary.get("uplink_ratio"), summary.get("downlink_ratio")
    if up is not None and down is not None:
        facts.append(("compress", f"vs float32: {times(up)} up, {times(down)} down"))
    attackers = summary.get("attackers") or []
    if attackers:
        shown = ", ".join(map(str, attackers[:12])) + (", ..." if len(attackers) > 12 else "")
        facts.append(("attackers", f"{len(attackers)} simulated: clients {shown}"))
    virtual = summary.get("virtual_seconds")
    if isinstance(virtual, int | float):  # the simulator's virtual clock (systems:)
        to_target = summary.get("virtual_seconds_to_target")
        said = "" if to_target is None else f", {format_duration(to_target)} to the target"
        facts.append(("virtual", f"{format_duration(virtual)} on the virtual clock{said}"))
    facts.extend(privacy_facts(summary))
    if summary.get("participation"):
        facts.append(("cohorts", participation_line(summary["participation"])))
    for why in EARLY_STOPS:  # a finished run that ended early
        if isinstance(summary.get(why), str):
            facts.append(("stopped", summary[why]))
    return facts


def privacy_facts(summary: dict[str, Any]) -> list[Fact]:
    """What DP ran and what it spent; under tiers, one line a tier."""
    priv = summary.get("privacy") or {}
    if priv.get("epsilon") is None:
        return []
    spent = f"at delta {priv['delta']:.3g} ({priv['accountant']}, noise multiplier "
    spent += f"{priv['noise_multiplier']})"
    tiers = priv.get("tiers")
    if tiers is None:
        how = priv["dp"]
        server = ""
        if how == "distributed":  # accounted as central DP; and against the server
            how += (
                f" (n_min {priv['min_survivors']}, client noise std {priv['client_noise_std']:.3g})"
            )
            if priv.get("epsilon_vs_server") is not None:  # runs from before it lack it
                server = f", {priv['epsilon_vs_server']:.3f} against the server"
        return [("privacy", f"dp {how}: epsilon {priv['epsilon']:.3f}{server} {spent}")]
    high, low = tiers["high"], tiers["low"]
    return [
        (
            "privacy",
            f"tier high, {high['clients']} clients: {high['applied']}; local epsilon max "
            f"{high['local_epsilon_max']:.3f}, median {high['local_epsilon_median']:.3f} {spent}",
        ),
        ("privacy", f"tier low, {low['clients']} clients: {low['applied']}"),
    ]


def times(ratio: float) -> str:
    """A dense-float32-over-real ratio in words: 4.00x fewer bytes, or 2.00x more."""
    if f"{ratio:.2f}" == "1.00" or f"{1 / ratio:.2f}" == "1.00":
        return "as many bytes"  # dense float32 (the headers aside)
    if ratio > 1:
        return f"{ratio:.2f}x fewer bytes"
    return f"{1 / ratio:.2f}x more bytes"
