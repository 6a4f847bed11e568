"""A one-line progress bar per run: round, test accuracy and loss, bytes so far, ETA."""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm


def format_bytes(n: float) -> str:
    """Bytes in binary units, e.g. ``12.3 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - unreachable


def format_duration(seconds: float) -> str:
    """Seconds as a person reads them: ``42.0 s``, ``12.5 min``, ``3.20 h``, ``2.10 d``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86_400:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 86_400:.2f} d"


def percent(accuracy: float | None) -> str:
    """An accuracy (a fraction) as every screen shows it, e.g. ``95.12%``; ``-``: none."""
    return "-" if accuracy is None else f"{100 * accuracy:.2f}%"


# the short labels of the built-in scores; another task's score shows by its name
_SCORE_LABELS = {"accuracy": "acc", "token accuracy": "token acc"}


def score_text(value: float | None, score_name: str = "accuracy") -> str:
    """A task's score as every screen shows it: R^2 as it is (``0.3272``), an
    accuracy (a fraction) in percent; ``-``: none."""
    if value is None:
        return "-"
    return f"{value:.4f}" if score_name == "R^2" else percent(value)


def named_score(value: float | None, score_name: str = "accuracy") -> str:
    """The score with what it is: ``acc 95.12%``, ``R^2 0.3272``; ``-``: none."""
    if value is None:
        return "-"
    return f"{_SCORE_LABELS.get(score_name, score_name)} {score_text(value, score_name)}"


def count(n: int, noun: str) -> str:
    """``n`` and the noun, plural but for 1: 1 round, 2 rounds."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


class Progress:
    """One line per run, updated once per finished round: on a terminal a tqdm bar
    redrawn in place, elsewhere (a file, a pipe) a plain line per round. Notes and
    warnings (``write``) go to the same stream, stderr by default, above the bar;
    stdout keeps what a run returns (its summary, tables)."""

    def __init__(
        self,
        total_rounds: int,
        desc: str,
        enabled: bool,
        stream: TextIO | None = None,
        initial: int = 0,  # rounds already done (a resumed run)
        score_name: str = "accuracy",  # the task's score: a share in %, or R^2 as is
    ):
        self._score = score_name
        self._stream = stream or sys.stderr
        self._name = desc
        self._total = total_rounds
        self._done = initial
        self._lines = enabled and not _is_terminal(self._stream)  # plain lines
        self._bar = tqdm(
            total=total_rounds,
            initial=initial,
            desc=desc,
            unit="round",
            disable=not enabled or self._lines,
            file=self._stream,
            dynamic_ncols=True,
            bar_format="{desc} |{bar:16}| [{elapsed}<{remaining}]",
        )

    def update(
        self,
        accuracy: float | None,
        loss: float | None,
        total_bytes: int,
        epsilon: float | None = None,  # privacy spent so far (DP runs)
    ) -> None:
        label = "R^2" if self._score == "R^2" else "acc"
        acc = f"{label} {score_text(accuracy, self._score)}"
        eps = "" if epsilon is None else f" eps {epsilon:.3f}"
        los = "-" if loss is None else f"{loss:.4f}"
        self._done += 1
        # the figures first: a narrow terminal cuts the run's name, not them
        text = (
            f"round {self._done}/{self._total} {acc} loss {los} "
            f"bytes up+down {format_bytes(total_bytes)}{eps}  {self._name}"
        )
        if self._lines:
            print(text, file=self._stream, flush=True)
            return
        self._bar.set_description_str(text, refresh=False)
        self._bar.update(1)

    def write(self, text: str) -> None:
        if self._bar.disable:
            print(text, file=self._stream, flush=True)
        else:
            self._bar.write(text, file=self._stream)

    def close(self) -> None:
        self._bar.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False
