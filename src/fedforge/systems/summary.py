"""A population of system profiles in a few numbers: the quantiles of each
client's compute speed, bandwidth each way, latency, failure probability and
long-run online fraction. Printed when a run starts, written beside its store
(``population.json``), in its summary and its HTML report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedforge.systems.availability import Availability
from fedforge.systems.profile import ClientProfile

QUANTILES = (0.1, 0.5, 0.9)
POPULATION_FILE = "population.json"  # beside the run store
# each figure: its key, its label, its unit and the scale it is shown in
FIGURES = (
    ("samples_per_s", "compute", "examples/s", 1.0),
    ("download_bps", "download", "Mbit/s", 8e-6),
    ("upload_bps", "upload", "Mbit/s", 8e-6),
    ("latency_s", "latency", "ms", 1e3),
    ("failure_prob", "failure probability", "", 1.0),
    ("online_fraction", "online fraction", "", 1.0),
)


def population_summary(profiles: list[ClientProfile], availability: Availability) -> dict[str, Any]:
    """The 10th, 50th and 90th percentiles of each figure over the clients (in
    their own units: examples a second, bytes a second, seconds)."""
    values: dict[str, list[float]] = {
        key: [float(getattr(p, key)) for p in profiles] for key, *_ in FIGURES[:-1]
    }
    values["online_fraction"] = [availability.fraction(p.client_id) for p in profiles]
    out: dict[str, Any] = {"clients": len(profiles)}
    for key, column in values.items():
        qs = np.quantile(np.asarray(column, dtype=np.float64), QUANTILES)
        out[key] = {f"p{round(100 * q)}": float(v) for q, v in zip(QUANTILES, qs, strict=True)}
    return out


def population_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The summary as table rows: figure, unit, p10, p50, p90 (shown units)."""
    rows = []
    for key, label, unit, scale in FIGURES:
        qs = summary.get(key)
        if not isinstance(qs, dict):
            continue
        rows.append([label, unit, *(f"{scale * float(qs[k]):.3g}" for k in ("p10", "p50", "p90"))])
    return rows


def format_population(summary: dict[str, Any]) -> str:
    """The start-up block: one line a figure, its 10th/50th/90th percentiles."""
    lines = [f"population: {summary['clients']} clients' system profiles (p10 / p50 / p90)"]
    for label, unit, *qs in population_rows(summary):
        lines.append(f"  {label:<20} {' / '.join(qs)}{' ' + unit if unit else ''}")
    return "\n".join(lines)


def write_population(path: Path, summary: dict[str, Any]) -> None:
    """The summary beside the run store, for its report (written whole)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary))
    tmp.replace(path)


def read_population(path: Path) -> dict[str, Any] | None:
    """The summary a run wrote (None: none, or not a summary)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "clients" in data else None


__all__ = [
    "POPULATION_FILE",
    "format_population",
    "population_rows",
    "population_summary",
    "read_population",
    "write_population",
]
