"""The range of every integer config field: its least value (each section's
``check()`` says why it is the least) and its greatest, a value past which the
field no longer means anything a run can do (a million rounds, ten million
clients, a billion examples a client). A value past the greatest is one
:class:`ConfigError` naming the field, its value and the range, before anything
sizes a buffer, a window or a loop by it (``robust.norm_window: 2**63`` once
ended in an OverflowError, ``batch_size: 2**63`` in torch's ValueError).

``check_bounds`` walks the config's dataclasses; an integer field missing from
:data:`BOUNDS` is a programming error (tests/test_config_limits.py lists them)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from fedforge.core.errors import invalid_field

MAX_ROUNDS = 1_000_000  # a round a minute for two years
MAX_CLIENTS = 10_000_000
MAX_EXAMPLES = 1_000_000_000  # one client's examples, a batch's
MAX_STEPS = 10_000  # iterations of a loop run per round or per update
DEFAULT_REFUSED_WINDOW = 10  # robust.refused_window's default
SEED_BITS = 63  # derived generators take a 64-bit seed

# dotted field name -> (least, greatest, what the greatest is)
BOUNDS: dict[str, tuple[int, int, str]] = {
    "seed": (-(1 << SEED_BITS), (1 << SEED_BITS) - 1, "a 64-bit seed"),
    "num_clients": (1, MAX_CLIENTS, "clients"),
    "partition.shards_per_client": (1, MAX_STEPS, "shards a client"),
    "partition.min_size": (1, MAX_EXAMPLES, "examples a client"),
    "local_epochs": (1, MAX_STEPS, "passes over a client's data a round"),
    "batch_size": (1, MAX_EXAMPLES, "examples a batch"),
    "weight_cap": (1, MAX_EXAMPLES, "examples a client"),
    "robust.byzantine": (0, MAX_CLIENTS, "clients"),
    "robust.multi_krum_m": (1, MAX_CLIENTS, "clients"),
    "robust.norm_window": (1, MAX_ROUNDS, "rounds"),
    "robust.centred_clip_iterations": (1, MAX_STEPS, "passes over the cohort's updates"),
    "robust.geomed_max_iter": (1, MAX_STEPS, "passes over the cohort's updates"),
    "robust.min_clients": (1, MAX_CLIENTS, "clients"),
    "robust.max_skipped_rounds": (0, MAX_ROUNDS, "rounds"),
    # a window is of upload rounds, and the rule fires only once one is full:
    # longer than the run, it never does (compat.refused_window_fits_run)
    "robust.refused_window": (1, MAX_ROUNDS, "rounds"),
    "communication.chunk_size": (1, MAX_EXAMPLES, "values a chunk"),
    "communication.upload_every": (1, MAX_ROUNDS, "rounds"),
    "communication.groups": (0, MAX_CLIENTS, "clients"),
    "privacy.weight_cap": (1, MAX_EXAMPLES, "examples a client"),
    "privacy.secagg_frac_bits": (4, 40, "fixed-point bits"),
    "privacy.secagg_neighbours": (2, MAX_CLIENTS, "clients"),
    "privacy.tiers.high_clients": (0, MAX_CLIENTS - 1, "client ids"),
    "perfedavg.steps": (1, MAX_STEPS, "meta-steps a round"),
    "rounds": (1, MAX_ROUNDS, "rounds"),
    "eval_every": (1, MAX_ROUNDS, "rounds"),
    "personal_eval.steps": (0, MAX_STEPS, "local steps an evaluation"),
    "diagnostics.low_cosine_rounds": (1, MAX_ROUNDS, "rounds"),
    "eval_batch_size": (1, MAX_EXAMPLES, "examples a batch"),
    "checkpoint_every": (0, MAX_ROUNDS, "rounds"),
    "workers": (0, 1024, "processes"),
    "threads": (1, 1024, "torch threads"),
    "deployment.start_clients": (1, MAX_CLIENTS, "clients"),
    "deployment.chunk_kib": (1, 4096, "KiB"),
    # each such call may hold a message of up to 4 MiB (admission.request_bytes)
    "deployment.pending_per_address": (1, 4096, "calls waiting for their request"),
    "deployment.pending_calls": (1, 4096, "calls waiting for their request: 16 GiB"),
    "deployment.max_waiting_calls": (1, 2 * MAX_CLIENTS, "waiting calls: two a client"),
    "deployment.canary_every": (0, MAX_ROUNDS, "rounds"),
    "deployment.canary_min_reports": (1, MAX_CLIENTS, "clients"),
}


def allowed(name: str) -> str:
    """The range of field ``name`` in words."""
    low, high, what = BOUNDS[name]
    return f"must be an integer in [{low:,}, {high:,}] ({what})"


def integer_fields(cls: Any, prefix: str = "") -> tuple[str, ...]:
    """The dotted names of ``cls``'s integer fields (an int, an int or null, a
    tuple of ints), its sections' too."""
    key = (cls, prefix)
    if key not in _FIELDS:
        _FIELDS[key] = _integer_fields(cls, prefix)
    return _FIELDS[key]


_FIELDS: dict[tuple[Any, str], tuple[str, ...]] = {}


def _integer_fields(cls: Any, prefix: str) -> tuple[str, ...]:
    hints = typing.get_type_hints(cls)
    names: tuple[str, ...] = ()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            names += integer_fields(tp, f"{prefix}{f.name}.")
        elif tp is int or int in typing.get_args(tp):
            names += (prefix + f.name,)
    return names


def check_bounds(cfg: Any) -> None:
    """Every integer field of ``cfg`` within its range (after the sections'
    own checks, which say why a least value is the least)."""
    for name in integer_fields(type(cfg)):
        value: Any = cfg
        for part in name.split("."):
            value = getattr(value, part)
        values = value if isinstance(value, tuple) else (value,)
        low, high, _ = BOUNDS[name]
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and not low <= v <= high:
                raise invalid_field(name, value, allowed(name))


def refused_window_fits_run(cfg: Any) -> None:
    """``robust.refused_window`` at most the run's upload rounds: the stop on
    refused updates judges a full window only, so a longer one never stops the
    run. The default (10) stands for runs shorter than it."""
    r = cfg.robust
    uploads = -(-cfg.rounds // cfg.communication.upload_every)
    most = max(uploads, DEFAULT_REFUSED_WINDOW)
    if r.max_refused_fraction is not None and r.refused_window > most:
        raise invalid_field(
            "robust.refused_window",
            r.refused_window,
            f"must be an integer in [1, {most}]: the run has {uploads} upload rounds, and "
            "a window it never fills never stops it (robust.max_refused_fraction)",
        )
