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


class Progress:
    """tqdm over the planned rounds; ``update`` once per finished round."""

    def __init__(
        self,
        total_rounds: int,
        desc: str,
        enabled: bool,
        stream: TextIO | None = None,
        initial: int = 0,  # rounds already done (a resumed run)
    ):
        self._bar = tqdm(
            total=total_rounds,
            initial=initial,
            desc=desc,
            unit="round",
            disable=not enabled,
            file=stream or sys.stderr,
            dynamic_ncols=True,
            bar_format="{desc} |{bar:16}| [{elapsed}<{remaining}]",
        )
        self._name = desc
        self._total = total_rounds

    def update(
        self,
        accuracy: float | None,
        loss: float | None,
        total_bytes: int,
        epsilon: float | None = None,  # privacy spent so far (DP runs)
    ) -> None:
        acc = "-" if accuracy is None else f"{100 * accuracy:.2f}%"
        eps = "" if epsilon is None else f" eps {epsilon:.3g}"
        los = "-" if loss is None else f"{loss:.4f}"
        done = self._bar.n + 1
        self._bar.set_description_str(
            f"{self._name} round {done}/{self._total} acc {acc} loss {los} "
            f"bytes {format_bytes(total_bytes)}{eps}",
            refresh=False,
        )
        self._bar.update(1)

    def write(self, text: str) -> None:
        self._bar.write(text)

    def close(self) -> None:
        self._bar.close()
