"""The built-in per-client learning-rate rules (``local.lr_rule``; the contract
in server/client_lr.py), registered through core/builtins.py as a plugin's are:

- ``data_size``: by the client's example count against the cohort's mean;
- ``reported_loss``: by the training loss the client last reported against the
  cohort's median (a proxy of its data's quality: noisy labels keep it high);
- ``lr_csv``: a scale per client read from a CSV file, checked when the run is
  built.

Runs on the server; each rule is a pure function of the round.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedforge.config.client_lr import DataSizeOptions, LrCsvOptions, ReportedLossOptions
from fedforge.core.errors import ConfigError

if TYPE_CHECKING:
    from fedforge.config.components import ComponentContext
    from fedforge.server.client_lr import LrRound


def _held(ratio: float, exponent: float, low: float, high: float) -> float:
    return float(min(max(ratio**exponent, low), high))


@dataclass(frozen=True)
class DataSize:
    """scale_k = (n_k / mean n)^exponent within [min_scale, max_scale]; a cohort
    whose counts are all unknown (0) keeps the plan's lr."""

    options: DataSizeOptions

    def scales(self, round: LrRound) -> dict[int, float]:
        o = self.options
        n = {c: float(round.sizes[c]) for c in round.cohort}
        mean = sum(n.values()) / max(len(n), 1)
        if mean <= 0:
            return {}
        return {
            c: _held(v / mean, o.exponent, o.min_scale, o.max_scale) for c, v in n.items() if v > 0
        }


@dataclass(frozen=True)
class ReportedLoss:
    """scale_k = (loss_k / median loss)^exponent within [min_scale, max_scale],
    over the cohort clients that have reported a positive finite loss."""

    options: ReportedLossOptions
    reads_losses = True  # refused where the run's privacy hides them (experiment.py)

    def scales(self, round: LrRound) -> dict[int, float]:
        o = self.options
        column = round.history.column("last_loss")
        known = {
            c: float(column[c])
            for c in round.cohort
            if c < len(column) and math.isfinite(column[c]) and column[c] > 0
        }
        if not known:
            return {}
        ordered = sorted(known.values())
        median = ordered[(len(ordered) - 1) // 2]  # the lower middle for an even count
        return {
            c: _held(v / median, o.exponent, o.min_scale, o.max_scale) for c, v in known.items()
        }


@dataclass(frozen=True)
class CsvScales:
    """The scales read from a file, by client id."""

    table: Mapping[int, float]

    def scales(self, round: LrRound) -> Mapping[int, float]:
        return self.table


def read_scales(path: str, num_clients: int) -> dict[int, float]:
    """``client_id,lr_scale`` rows of ``path``; one ``ConfigError`` line naming the
    file and the value when the file is missing or a row is not a known client
    with a positive finite scale."""
    where = f"plugin_options.lr_csv.path = {path!r}"
    try:
        with Path(path).open(newline="") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if not rows or [h.strip() for h in rows[0]] != ["client_id", "lr_scale"]:
        head = ",".join(rows[0]) if rows else "(empty file)"
        raise ConfigError(f"{where}: its header is {head!r}; it must be 'client_id,lr_scale'")
    table: dict[int, float] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 2:
            raise ConfigError(f"{where}, line {line}: {','.join(row)!r} is not client_id,lr_scale")
        client, scale = _client(row[0], num_clients), _scale(row[1])
        if client is None:
            raise ConfigError(
                f"{where}, line {line}: client_id {row[0].strip()!r} is not a client of this "
                f"federation (0 to {num_clients - 1})"
            )
        if scale is None:
            raise ConfigError(
                f"{where}, line {line}: lr_scale {row[1].strip()!r} for client {client} "
                "must be a positive finite number"
            )
        if client in table:
            raise ConfigError(f"{where}, line {line}: client {client} is given twice")
        table[client] = scale
    return table


def _client(text: str, num_clients: int) -> int | None:
    try:
        client = int(text.strip())
    except ValueError:
        return None
    return client if 0 <= client < num_clients else None


def _scale(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def data_size(context: ComponentContext) -> DataSize:
    return DataSize(context.options or DataSizeOptions())


def reported_loss(context: ComponentContext) -> ReportedLoss:
    return ReportedLoss(context.options or ReportedLossOptions())


def lr_csv(context: ComponentContext) -> CsvScales:
    options = context.options or LrCsvOptions()
    options.check()
    return CsvScales(read_scales(options.path, context.cfg.num_clients))
