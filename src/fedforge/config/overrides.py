"""Dotted overrides (``partition.alpha=0.3``, ``-s`` on the command line) applied
to a config's plain data before anything is checked: a config file and its
overrides are read as one config, so an override may replace a value the file
alone could not run with (a plugin's name, a plugin file that is not there)."""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from fedforge.config.moved import MOVED, spellings
from fedforge.config.schema import Config
from fedforge.config.task import BUILT_IN_TASKS
from fedforge.core.errors import ConfigError


def with_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the plain config ``data`` with the dotted fields of ``overrides``
    replaced; a section the data leaves out is started empty. A new ``task`` drops
    the data's dataset and model unless they are said too; a dataset or model of
    its own turns a built-in task into that pair. An override replaces its field
    in either spelling (``mu`` and ``fedprox.mu``: config/moved.py)."""
    out = copy.deepcopy(dict(data))
    said = {dotted.split(".")[0] for dotted in overrides}
    task = out.get("task")
    if "task" in said:
        for name in ("dataset", "model"):
            if name not in said:
                out.pop(name, None)
    elif said & {"dataset", "model"} and isinstance(task, str) and task in BUILT_IN_TASKS:
        for name, value in zip(("dataset", "model"), BUILT_IN_TASKS[task], strict=True):
            out.setdefault(name, value)
        out["task"] = None
    for dotted, value in overrides.items():
        for other in spellings(dotted):  # the field in either spelling: replaced
            _drop(out, other.split("."))
        node: dict[str, Any] = out
        tp: Any = Config
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            if i == 0 and part in MOVED:  # an old spelling: the type at its new place
                section, name = MOVED[part].split(".")
                tp = _section_type(_section_type(tp, section), name)
            else:
                tp = _section_type(tp, part)
            child = node.get(part)
            if child is None and tp is not None and part not in node:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"unknown config section '{part}' in override '{dotted}'")
            node = child
        node[parts[-1]] = value
    return out


def _drop(data: dict[str, Any], parts: list[str]) -> None:
    """Remove the value at the dotted ``parts`` of plain ``data``, if it is there."""
    for part in parts[:-1]:
        child = data.get(part)
        if not isinstance(child, dict):
            return
        data = child
    data.pop(parts[-1], None)


def _section_type(tp: Any, part: str) -> Any:
    """The type of field ``part`` of ``tp`` when it is a section (a dataclass) or a
    mapping by name (``plugin_options``); None otherwise."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        tp = typing.get_type_hints(tp).get(part)
    elif typing.get_origin(tp) is dict:
        tp = typing.get_args(tp)[1]
    else:
        return None
    if (isinstance(tp, type) and dataclasses.is_dataclass(tp)) or typing.get_origin(tp) is dict:
        return tp
    return None
