"""Plotly figures drawn from a report's gathered data (``gather.py``,
``clients.py``): nothing here reads a store. Each builder returns the section's
figures as (name, figure) pairs, none when the section has no data.

Text that plotly draws (trace names, reasons, group names) is HTML-escaped:
plotly.js reads a few tags in labels and turns entities back into characters.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from fedforge.report.html.gather import Data

Figures = list[tuple[str, go.Figure]]
Trace = tuple[str, Sequence[Any], Sequence[Any]]  # name, x, y
MARKERS_BELOW = 60  # points in a series drawn with markers as well as lines
SHORT = 45  # characters of a reason on an axis (the hover shows it whole)
WHOLE_TICKS = 12  # rounds (or client ids) up to which every one has its tick


def label(text: Any) -> str:
    """Text as plotly should draw it, literally."""
    return html.escape(str(text))


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str) -> go.Figure:
    fig.update_layout(
        title={"text": label(title), "x": 0.0, "font": {"size": 15}},
        template="plotly_white",
        height=340,
        margin={"l": 60, "r": 20, "t": 50, "b": 45},
        legend={"orientation": "h", "y": -0.2},
        hovermode="x unified" if x_title.startswith("round") else "closest",
    )
    fig.update_xaxes(title_text=label(x_title))
    fig.update_yaxes(title_text=label(y_title))
    if x_title in ("round", "client"):  # whole numbers: no tick at round 1.5
        xs = [v for t in fig.data for v in (t.x or ()) if isinstance(v, int | float)]
        fig.update_xaxes(tickformat="d", dtick=1 if max(xs, default=0) <= WHOLE_TICKS else None)
    return fig


def lines(title: str, traces: Sequence[Trace], y_title: str, x_title: str = "round") -> go.Figure:
    """One line per trace; gaps (None) are bridged (a round not evaluated)."""
    fig = go.Figure()
    for name, x, y in traces:
        mode = "lines+markers" if len(x) < MARKERS_BELOW else "lines"
        fig.add_trace(
            go.Scatter(x=list(x), y=list(y), name=label(name), mode=mode, connectgaps=True)
        )
    fig.update_layout(showlegend=True)  # which run or series, even when alone
    return _layout(fig, title, x_title, y_title)


def bars(title: str, x: Sequence[Any], y: Sequence[Any], x_title: str, y_title: str) -> go.Figure:
    """Bars without outlines or gaps (a thousand of them stay visible)."""
    xs = [label(v) if isinstance(v, str) else v for v in x]
    fig = go.Figure(go.Bar(x=xs, y=list(y), marker_line_width=0))
    fig.update_layout(bargap=0.1 if len(xs) < MARKERS_BELOW else 0.0)
    return _layout(fig, title, x_title, y_title)


def distribution(
    title: str, values: Sequence[float] | None, bins: Data | None, x_title: str
) -> go.Figure:
    """A histogram of raw values (binned by plotly), or of bins made already."""
    if bins is None:
        fig = go.Figure(go.Histogram(x=list(values or []), nbinsx=30))
    else:
        edges, counts = bins["edges"], bins["counts"]
        mids = [(a + b) / 2 for a, b in zip(edges, edges[1:], strict=False)]
        widths = [b - a for a, b in zip(edges, edges[1:], strict=False)]
        fig = go.Figure(go.Bar(x=mids, y=counts, width=widths))
    return _layout(fig, title, x_title, "clients")


def _has(values: Sequence[Any] | None) -> bool:
    return bool(values) and any(v is not None for v in values or [])


def progress_figures(d: Data) -> Figures:
    x = d["round"]
    out: Figures = []
    if _has(d["test_accuracy"]):
        out.append(
            (
                "accuracy",
                lines("Test accuracy", [("test accuracy", x, d["test_accuracy"])], "accuracy"),
            )
        )
    losses = [
        (n, x, d[k])
        for n, k in (("test loss", "test_loss"), ("train loss", "train_loss"))
        if _has(d[k])
    ]
    if losses:
        out.append(("loss", lines("Loss", losses, "loss")))
    return out


def time_figures(d: Data) -> Figures:
    if not d["round"]:
        return []
    x = d["round"]
    out: Figures = [
        ("seconds", lines("Wall seconds per round", [("seconds", x, d["seconds"])], "seconds")),
        (
            "cumulative",
            lines("Wall time, cumulative", [("seconds", x, d["cumulative_seconds"])], "seconds"),
        ),
    ]
    if d["virtual_time"] is not None:
        out.append(
            (
                "virtual",
                lines("Virtual time", [("virtual time", x, d["virtual_time"])], "virtual time"),
            )
        )
    return out


def client_figures(d: Data) -> Figures:
    if d["round"] is None:
        return []
    over = d["over_rounds"]
    return [
        (
            "histogram",
            distribution(
                f"Per-client accuracy, round {d['round']}", d["accuracy"], d["bins"], "accuracy"
            ),
        ),
        (
            "percentiles",
            lines(
                "Per-client accuracy by round",
                [
                    (k if k != "p10" else "10th percentile", over["round"], over[k])
                    for k in ("mean", "p10", "min")
                ],
                "accuracy",
            ),
        ),
    ]


def group_figures(d: Data) -> Figures:
    out: Figures = []
    for i, (attribute, entry) in enumerate(d["attributes"].items()):
        traces = [(g, s["round"], s["accuracy"]) for g, s in entry["groups"].items()]
        out.append(
            (f"attribute-{i}", lines(f"Accuracy per group: {attribute}", traces, "accuracy"))
        )
    return out


def participation_figures(d: Data) -> Figures:
    out: Figures = []
    if d["clients_seen"]:
        if d["bins"] is not None:
            fig = distribution("Rounds aggregated per client", None, d["bins"], "rounds")
        else:
            fig = bars(
                "Rounds aggregated per client", d["client_id"], d["rounds"], "client", "rounds"
            )
        out.append(("participation", fig))
    if not d["asked_recorded"]:
        return out
    out.append(
        ("asked", distribution("Clients by rounds asked", d["asked"], d["asked_bins"], "rounds"))
    )
    asked, used = d["lorenz_asked"], d["lorenz_used"]
    curves: list[Trace] = [
        ("rounds asked", asked["clients"], asked["share"]),
        ("rounds aggregated", used["clients"], used["share"]),
        ("equal shares", [0.0, 1.0], [0.0, 1.0]),
    ]
    lorenz = lines(
        "Lorenz curve of participation", curves, "share of participations", "share of clients"
    )
    out.append(("lorenz", lorenz))
    return out


def update_figures(d: Data) -> Figures:
    out: Figures = overlap_figures(d.get("overlap"))
    if d["source"] is None:
        return out
    x = d["round"]
    out.insert(
        0,
        (
            "norms",
            lines(
                "Update norms",
                [("median", x, d["norm_median"]), ("max", x, d["norm_max"])],
                "L2 norm",
            ),
        ),
    )
    if d["mean_cosine"] is not None and _has(d["mean_cosine"]):
        out.append(
            (
                "cosine",
                lines(
                    "Mean pairwise cosine",
                    [("mean cosine", x, d["mean_cosine"])],
                    "cosine",
                ),
            )
        )
    return out


def overlap_figures(d: Data | None) -> Figures:
    """The overlap of the uploads' index sets, against sets drawn at random."""
    if d is None or not _has(d["pair_overlap"]):
        return []
    x = d["round"]
    series = [
        ("pair overlap", x, d["pair_overlap"]),
        ("random sets", x, d["chance"]),
        ("kept by any", x, d["union"]),
        ("kept by all", x, d["common"]),
    ]
    return [("overlap", lines("Index overlap of the uploads", series, "fraction"))]


def refused_figures(d: Data) -> Figures:
    if not d["refused"]:
        return []
    reasons, clients = d["by_reason"], d["by_client"]
    short = [label(r if len(r) <= SHORT else r[: SHORT - 1] + "\u2026") for r in reasons["reason"]]
    fig = go.Figure(
        go.Bar(
            y=short,
            x=reasons["count"],
            orientation="h",
            hovertext=[label(r) for r in reasons["reason"]],
            hoverinfo="text+x",
        )
    )
    fig = _layout(fig, "Refused uploads by reason", "uploads", "")
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_layout(height=max(240, 40 + 28 * len(reasons["reason"])))
    per_round = d["per_round"]
    return [
        ("by-reason", fig),
        (
            "by-client",
            bars(
                "Refused uploads by client",
                [str(c) for c in clients["client_id"]],
                clients["count"],
                "client",
                "uploads",
            ),
        ),
        (
            "per-round",
            bars(
                "Refused uploads per round",
                per_round["round"],
                per_round["count"],
                "round",
                "uploads",
            ),
        ),
    ]


def privacy_figures(d: Data) -> Figures:
    if not d["round"]:
        return []
    x = d["round"]
    traces: list[Trace] = [("epsilon spent", x, d["epsilon"])]
    if d["budget"] is not None:
        traces.append(("budget (target_epsilon)", [x[0], x[-1]], [d["budget"], d["budget"]]))
    return [("epsilon", lines("Epsilon spent", traces, "epsilon"))]


def bytes_figures(d: Data) -> Figures:
    if not d["round"]:
        return []
    x = d["round"]
    out: Figures = [
        (
            "bytes",
            lines(
                "Bytes per round", [("up", x, d["bytes_up"]), ("down", x, d["bytes_down"])], "bytes"
            ),
        )
    ]
    ratios = [(n, x, d[k]) for n, k in (("up", "ratio_up"), ("down", "ratio_down")) if _has(d[k])]
    if ratios:
        out.append(("ratio", lines("Compression (float32 / sent)", ratios, "ratio")))
    return out
