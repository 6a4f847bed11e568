"""Fields that moved from the top level into their component's section, by
their old spelling. A config that still spells one the old way (a YAML file, a
``--set`` override, ``Config(...)``, the config stored by a run made before) is
read as the new spelling, and its run says so in one line (notes.py); both
spellings with different values are refused, in one line naming both."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from fedforge.core.errors import ConfigError, shown

# old top-level name -> section.field
MOVED: dict[str, str] = {
    "mu": "fedprox.mu",
    "server_lr": "server_optimizer.lr",
    "aggregation_weights": "aggregation.weights",
    "weight_cap": "aggregation.weight_cap",
    "quality_temperature": "aggregation.quality_temperature",
    "quality_holdout": "aggregation.quality_holdout",
    "eval_every": "evaluation.every",
    "eval_initial": "evaluation.initial",
    "eval_clients": "evaluation.clients",
    "eval_holdout": "evaluation.holdout",
    "eval_batch_size": "evaluation.batch_size",
    "metrics": "evaluation.metrics",
    "personal_eval": "evaluation.personal",
    "client_tags": "evaluation.client_tags",
}

_SAID = "_moved_from"  # a Config's attribute: the old spellings it was given


def _disagree(old: str, old_value: Any, new: str, new_value: Any) -> ConfigError:
    return ConfigError(
        f"config fields '{old}' = {shown(old_value)} and '{new}' = {shown(new_value)} "
        f"disagree: '{old}' is the old spelling of '{new}'; give only '{new}'"
    )


def _merged(old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """One value from both spellings: equal ones, or two mappings (a moved
    section) whose common keys agree."""
    if isinstance(old_value, Mapping) and isinstance(new_value, Mapping):
        out = dict(new_value)
        for key, value in old_value.items():
            if key in out:
                out[key] = _merged(f"{old}.{key}", value, f"{new}.{key}", out[key])
            else:
                out[key] = value
        return out
    if old_value != new_value:
        raise _disagree(old, old_value, new, new_value)
    return new_value


def moved_data(data: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Plain config ``data`` with each old spelling at its new place, and the old
    names it held. A section that is not a mapping is left for the parser to
    refuse."""
    out = dict(data)
    said = tuple(old for old in MOVED if old in out)
    for old in said:
        value = out.pop(old)
        section, name = MOVED[old].split(".")
        node = out.setdefault(section, {})
        if not isinstance(node, Mapping):
            continue
        node = out[section] = dict(node)
        node[name] = _merged(old, value, MOVED[old], node[name]) if name in node else value
    return out, said


def spellings(dotted: str) -> tuple[str, ...]:
    """Every dotted name under which plain config data may hold ``dotted`` (in
    either spelling) or a part of it: what an override of ``dotted`` replaces."""
    first, _, rest = dotted.partition(".")
    new = MOVED[first] + ("." + rest if rest else "") if first in MOVED else dotted
    out = [new]
    for old, target in MOVED.items():
        if target == new or target.startswith(new + "."):
            out.append(old)
        elif new.startswith(target + "."):
            out.append(old + new[len(target) :])
    return tuple(out)


def new_spelling(dotted: str) -> str:
    """``dotted`` (``personal_eval.steps``) in the new spelling
    (``evaluation.personal.steps``)."""
    return spellings(dotted)[0]


def moved_kwargs(cls: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``Config(...)``'s keyword arguments with each old spelling put in its
    section (the section given, or its default); a section given with another
    value there than its default and the old one is refused."""
    said = tuple(old for old in MOVED if old in kwargs)
    if not said:
        return kwargs, ()
    hints = typing.get_type_hints(cls)
    out = dict(kwargs)
    for old in said:
        value = out.pop(old)
        section, name = MOVED[old].split(".")
        default = hints[section]()
        given = out.get(section, default)
        if not dataclasses.is_dataclass(given) or isinstance(given, type):
            continue  # not a section: the dataclass's own check refuses it
        now = getattr(given, name)
        if now != getattr(default, name) and now != value:
            raise _disagree(old, value, MOVED[old], now)
        out[section] = dataclasses.replace(given, **{name: value})
    return out, said


def remember(cfg: Any, said: tuple[str, ...]) -> None:
    """Record on ``cfg`` the old spellings it was given (added to any it has)."""
    if said:
        before = given_old(cfg)
        object.__setattr__(cfg, _SAID, before + tuple(s for s in said if s not in before))


def given_old(cfg: Any) -> tuple[str, ...]:
    """The old spellings ``cfg`` was given (not a field: equality ignores it)."""
    return tuple(getattr(cfg, _SAID, ()))


def moved_note(cfg: Any) -> str | None:
    """The run's one line on the old spellings its config used (None: none)."""
    said = given_old(cfg)
    if not said:
        return None
    which = ", ".join(f"{old} is now {MOVED[old]}" for old in said)
    return f"{which} (the old spelling{'s are' if len(said) > 1 else ' is'} still read)"
