"""``fedforge compare RUN RUN ...``: several runs' curves overlaid on one page
(test accuracy and loss by round, accuracy against bytes, cumulative wall
time, bytes and the compression ratio each way, epsilon) and a table of their
headline figures. Runs are named as ``fedforge show`` names one, or by a glob
pattern or a folder of runs (a sweep's points are ordinary runs named after
the sweep's config: ``'NAME-*'`` finds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path

from fedforge.report.html import gather
from fedforge.report.html.figures import Figures, Trace, lines
from fedforge.report.html.gather import Data
from fedforge.report.html.page import Section, render, table
from fedforge.report.html.run_report import SUMMARY_HEADERS, summary_row, write_html
from fedforge.report.shown_config import shown_config
from fedforge.store.runstore import RunStore


def gather_compared(run_dirs: Sequence[Path]) -> tuple[list[Data], list[Data]]:
    """Each run's identity and curves: accuracy and losses by round, wall seconds
    (cumulative), bytes (both ways, cumulative), the compression ratio each way
    (as the report has it), epsilon by round."""
    idents, series = [], []
    for path in run_dirs:
        with RunStore.open(path, read_only=True) as store:
            cfg, rounds = shown_config(store), store.rounds()
            ident = gather.identity(store, cfg, rounds)
            priv = gather.privacy(store, cfg)
            timing = gather.timing(store, rounds)
        curves = gather.progress(rounds)
        traffic = gather.traffic(rounds)
        total = list(accumulate(r.bytes_up + r.bytes_down for r in rounds))
        idents.append(ident)
        series.append(
            {
                "run_id": ident["run_id"],
                **curves,
                "cumulative_seconds": timing["cumulative_seconds"],
                "cumulative_bytes": total,
                "ratio_up": traffic["ratio_up"],
                "ratio_down": traffic["ratio_down"],
                "privacy_round": priv["round"],
                "epsilon": priv["epsilon"],
                "budget": priv["budget"],
            }
        )
    return idents, series


# what each section embeds of each run's curves
CURVES = {
    "accuracy": ("round", "test_accuracy", "cumulative_bytes"),
    "loss": ("round", "test_loss", "train_loss"),
    "time": ("round", "cumulative_seconds"),
    "bytes": ("round", "cumulative_bytes", "ratio_up", "ratio_down"),
    "privacy": ("privacy_round", "epsilon", "budget"),
}


def _overlay(series: list[Data], x_key: str, y_key: str) -> list[Trace]:
    """One trace per run that has any value of ``y_key``."""
    return [
        (s["run_id"], s[x_key], s[y_key]) for s in series if any(v is not None for v in s[y_key])
    ]


def _curves(series: list[Data]) -> list[Section]:
    def section(key: str, title: str, figs: Figures, what: str) -> Section:
        data = [{k: s[k] for k in ("run_id", *CURVES[key])} for s in series]
        kept = [(name, fig) for name, fig in figs if fig.data]
        empty = None if kept else f"None of the runs recorded {what}."
        return Section(key, title, data, figures=kept, empty=empty)

    return [
        section(
            "accuracy",
            "Accuracy",
            [
                (
                    "by-round",
                    lines("Test accuracy", _overlay(series, "round", "test_accuracy"), "accuracy"),
                ),
                (
                    "by-bytes",
                    lines(
                        "Accuracy against bytes (both ways)",
                        _overlay(series, "cumulative_bytes", "test_accuracy"),
                        "accuracy",
                        x_title="bytes",
                    ),
                ),
            ],
            "a test accuracy",
        ),
        section(
            "loss",
            "Loss",
            [
                ("test", lines("Test loss", _overlay(series, "round", "test_loss"), "loss")),
                ("train", lines("Train loss", _overlay(series, "round", "train_loss"), "loss")),
            ],
            "a loss",
        ),
        section(
            "time",
            "Time",
            [
                (
                    "cumulative",
                    lines(
                        "Wall time, cumulative",
                        _overlay(series, "round", "cumulative_seconds"),
                        "seconds",
                    ),
                )
            ],
            "a round",
        ),
        section(
            "bytes",
            "Bytes and compression",
            [
                (
                    "cumulative",
                    lines(
                        "Bytes, both ways, cumulative",
                        _overlay(series, "round", "cumulative_bytes"),
                        "bytes",
                    ),
                ),
                *(
                    (
                        f"ratio-{way}",
                        lines(
                            f"Compression ratio, {way} (float32 bytes / bytes sent)",
                            _overlay(series, "round", f"ratio_{way}"),
                            "ratio",
                        ),
                    )
                    for way in ("up", "down")
                ),
            ],
            "a round",
        ),
        section(
            "privacy",
            "Privacy",
            [
                (
                    "epsilon",
                    lines("Epsilon spent", _overlay(series, "privacy_round", "epsilon"), "epsilon"),
                )
            ],
            "privacy spent (no DP run)",
        ),
    ]


def compare_html(run_dirs: Sequence[Path]) -> str:
    """The page comparing the runs at ``run_dirs``."""
    idents, series = gather_compared(run_dirs)
    summary = Section(
        "summary",
        "Summary",
        {"runs": idents},
        body=table(SUMMARY_HEADERS, [summary_row(i) for i in idents], text_columns=3),
    )
    names = ", ".join(i["run_id"] for i in idents)
    return render(f"fedforge compare: {len(idents)} runs", [names], [summary, *_curves(series)])


def write_compare(run_dirs: Sequence[Path], out: Path) -> Path:
    """Write the comparison of the runs at ``run_dirs`` to ``out``."""
    return write_html(compare_html(run_dirs), out)
