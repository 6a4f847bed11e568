"""The options of the built-in per-client learning-rate rules (``local.lr_rule``;
server/lr_rules.py), as a config gives them under ``plugin_options`` by the
rule's name (``plugin_options: {data_size: {exponent: 0.5}}``), each field's
allowed values declared in its annotation (config/ranges.py); and how the
per-client lr and the relative upload clip fit the rest of a run. This module
imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fedforge.config.ranges import Range
from fedforge.core.errors import ConfigError, invalid_field

# every scale a rule gives lies in [min_scale, max_scale]
_MIN = Range("> 0", note="the smallest scale a client's lr gets")
_MAX = Range("> 0", note="the largest scale a client's lr gets; at least min_scale")


def _bounds(name: str, low: float, high: float) -> None:
    if high < low:
        raise invalid_field(
            f"plugin_options.{name}.max_scale", high, f"must be >= min_scale ({low:g})"
        )


@dataclass(frozen=True)
class DataSizeOptions:
    """``data_size``: client k's lr times (n_k / mean n)^exponent, n_k its example
    count and the mean over the round's cohort, held to [min_scale, max_scale]."""

    exponent: Annotated[float, Range("[-4, 4]", note="1: proportional to n_k")] = 1.0
    min_scale: Annotated[float, _MIN] = 0.25
    max_scale: Annotated[float, _MAX] = 4.0

    def check(self) -> None:
        _bounds("data_size", self.min_scale, self.max_scale)


@dataclass(frozen=True)
class ReportedLossOptions:
    """``reported_loss``: client k's lr times (loss_k / median loss)^exponent, loss_k
    the training loss it reported when the model last took its update and the
    median over the cohort's reported ones (the lower middle one of an even
    count), held to [min_scale, max_scale]; a client that has reported none
    trains at the plan's lr (scale 1). The default
    exponent -1 gives a client whose loss runs high (noisy, lower-quality data) a
    smaller step."""

    exponent: Annotated[float, Range("[-4, 4]", note="-1: inversely proportional")] = -1.0
    min_scale: Annotated[float, _MIN] = 0.25
    max_scale: Annotated[float, _MAX] = 4.0

    def check(self) -> None:
        _bounds("reported_loss", self.min_scale, self.max_scale)


@dataclass(frozen=True)
class LrCsvOptions:
    """``lr_csv``: a CSV file with a header ``client_id,lr_scale`` and one row per
    client; a client not in it trains at the plan's lr (scale 1)."""

    path: str = ""

    def check(self) -> None:
        if not self.path:
            raise invalid_field("plugin_options.lr_csv.path", self.path, "must name a CSV file")


def client_lr_fits(
    lr_rule: str | None,
    clip_multiple: float | None,
    buffered: bool,
    dp: str,
    tiers: bool,
    secagg: bool,
) -> None:
    """A per-client lr and a clip bound relative to recent norms, refused in one
    line each where they cannot hold."""
    if lr_rule is not None and buffered:
        raise ConfigError(
            f"local.lr_rule = '{lr_rule}' with asynchronous.mode = 'fedbuff': a buffered "
            "step hands work one client at a time outside a cohort's round; set "
            "local.lr_rule to null"
        )
    if clip_multiple is None:
        return
    said = f"communication.clip_multiple = {clip_multiple:g}"
    if dp != "none" or tiers:
        what = "privacy.tiers" if tiers else f"privacy.dp = '{dp}'"
        raise ConfigError(
            f"{said} with {what}: DP's noise is calibrated to a fixed bound, "
            "privacy.clip_norm; set communication.clip_multiple to null"
        )
    if secagg:
        raise ConfigError(
            f"{said} with privacy.secagg: the server sees no update's norm to take the "
            "median of; clip at a fixed communication.clip_norm instead"
        )
