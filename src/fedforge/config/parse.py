"""The run configuration in and out: YAML files, plain dicts and dotted
overrides (``partition.alpha=0.3``), checked against the schema's annotations."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from fedforge.config.moved import given_old, moved_data, remember
from fedforge.config.overrides import with_overrides
from fedforge.config.ranges import check_ranges
from fedforge.config.schema import Config, invalid
from fedforge.config.task import BUILT_IN_TASKS
from fedforge.core.errors import ConfigError, shown

_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")

# A config nests a few levels (a section, a list in it): these bound what a YAML
# document or a --set value may hold before anything is built from it.
MAX_DEPTH = 50  # PyYAML's composer recurses: thousands of levels overflow Python's stack
MAX_VALUES = 100_000  # values once aliases are expanded: an alias bomb is refused unbuilt


def _coerce(name: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp`` (after ``get_type_hints``)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        options = typing.get_args(tp)
        if value not in options:
            raise invalid(name, value, "must be one of " + ", ".join(repr(o) for o in options))
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        nulls = ("null", "none", "all") if name == "batch_size" else ("null", "none")
        is_null = value is None or (isinstance(value, str) and value.lower() in nulls)
        if is_null and type(None) in args:
            return None
        errors: list[ConfigError] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(name, value, arg)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) > 1:
            raise invalid(name, value, f"must be {_describe(tp)}")
        if type(None) in args:  # say that null is allowed too
            raise ConfigError(f"{errors[0]}, or null")
        raise errors[0]
    if origin is tuple:  # tuple[X, ...]: a YAML list, or "a,b" from the command line
        (item,) = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if isinstance(value, str):  # each item read as YAML, as a --set value is
            value = [scalar(v) for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise invalid(name, value, "must be a list")
        return tuple(_coerce(name, v, item) for v in value)
    if origin is dict:  # a mapping by name (plugin_options): each value read later
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise invalid(name, value, "must be a mapping")
        return {
            _coerce(name, k, key_tp): _coerce(f"{name}.{k}", v, value_tp) for k, v in value.items()
        }
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise invalid(name, value, f"must be a mapping of {getattr(tp, '__name__', tp)} fields")
        return _build(tp, value, prefix=name + ".")
    if tp is bool:
        if not isinstance(value, bool):
            raise invalid(name, value, "must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(name, value, "must be an integer")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise invalid(name, value, "must be a number")
        try:
            number = float(value)  # an int past float's range (10**400) overflows
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):  # YAML's .inf, or 1e400
            raise invalid(name, value, "must be a finite number")
        return number
    if tp is str:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # name: 2024 (YAML reads a number)
        if not isinstance(value, str):
            raise invalid(name, value, "must be a string")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} for {name}")  # programming error


def _describe(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    names = [getattr(a, "__name__", str(a)) for a in args]
    return " or ".join(names) + (" or null" if type(None) in typing.get_args(tp) else "")


def _build(cls: Any, data: Mapping[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in hints:
            label = key if isinstance(key, str) and len(key) <= 80 else shown(key)
            close = difflib.get_close_matches(str(label), known, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ConfigError(
                f"unknown config field '{prefix}{label}'{hint}; known fields: " + ", ".join(known)
            )
        kwargs[key] = _coerce(prefix + key, value, hints[key])
    return cls(**kwargs)


def build_section(cls: Any, data: Any, prefix: str) -> Any:
    """An instance of the dataclass ``cls`` (a section, or a plugin's options) from
    plain ``data``, each field checked against its annotation, then its
    ``check()`` if it has one; errors name the field as ``prefix`` + field."""
    if not isinstance(data, Mapping):
        raise invalid(prefix.rstrip("."), data, f"must be a mapping of {cls.__name__} fields")
    section = _build(cls, data, prefix)
    check_ranges(section, prefix)
    check = getattr(section, "check", None)
    if callable(check):
        try:
            check()
        except ConfigError:
            raise
        except ValueError as exc:  # a plugin's own check may say what is wrong plainly
            raise ConfigError(f"config field '{prefix.rstrip('.')}' is invalid: {exc}") from None
    return section


def from_dict(data: Mapping[str, Any]) -> Config:
    """Build and validate a :class:`Config` from plain data (e.g. parsed YAML); a
    moved field's old spelling (``mu``) is read as its new one (``fedprox.mu``)."""
    _check_task_pair(data)
    data, said = moved_data(data)
    result: Config = _build(Config, data)
    remember(result, said)
    return result


def _check_task_pair(data: Mapping[str, Any]) -> None:
    """Plain data naming a built-in task and a dataset or model names the task's."""
    task = data.get("task")
    if not isinstance(task, str) or task not in BUILT_IN_TASKS:
        return
    for field, want in zip(("dataset", "model"), BUILT_IN_TASKS[task], strict=True):
        if field in data and data[field] != want:
            raise ConfigError(
                f"{field} = {shown(data[field])} disagrees with task = {task!r}, which trains "
                f"model {BUILT_IN_TASKS[task][1]!r} on dataset {BUILT_IN_TASKS[task][0]!r}: "
                "drop one of the two"
            )


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain data that :func:`from_dict` turns back into the same config (tuples as
    lists, so that YAML and JSON hold them)."""
    return _lists(dataclasses.asdict(cfg))


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_lists(v) for v in value]
    return value


def load(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Config:
    """Read a YAML config file, with the dotted ``overrides`` applied to its data
    before it is checked (once: the names it gives are those after them)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file '{path}' cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file '{path}' is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except TooLarge as exc:
        raise ConfigError(f"config file '{path}' is refused: {yaml_problem(exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file '{path}' is not valid YAML: {yaml_problem(exc)}") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError(f"config file '{path}' holds a value YAML cannot read: {exc}") from None
    except RecursionError:  # the depth limit's backstop (a caller deep in its own stack)
        raise ConfigError(
            f"config file '{path}' nests too deeply to read; at most {MAX_DEPTH} levels"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file '{path}' must hold a mapping of fields, not {shown(data)}")
    data = _plugin_files_beside(dict(data), path.parent)
    return from_dict(with_overrides(data, overrides) if overrides else data)


def _plugin_files_beside(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A config file's ``plugins`` that are relative ``.py`` paths, read from the
    file's folder (a module name stays a name): the run stores where they are."""
    plugins = data.get("plugins")
    if isinstance(plugins, list):
        data["plugins"] = [
            str((folder / p).resolve())
            if isinstance(p, str) and p.endswith(".py") and not Path(p).is_absolute()
            else p
            for p in plugins
        ]
    return data


class TooLarge(yaml.MarkedYAMLError):
    """A YAML document nested past :data:`MAX_DEPTH` levels, or holding more than
    :data:`MAX_VALUES` values once its aliases are expanded (or an alias inside
    the node it names)."""


class _LimitedLoader(yaml.SafeLoader):
    """YAML's safe loader within :data:`MAX_DEPTH` and :data:`MAX_VALUES`: the
    composer counts its depth; the node graph's expanded size is counted (each
    shared node once) before any Python object is constructed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise TooLarge(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        _expanded_size(node, {})
        return super().construct_document(node)


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` stands for with every alias expanded; raises
    :class:`TooLarge` past :data:`MAX_VALUES` or on an alias inside its own anchor.
    Recurses at most :data:`MAX_DEPTH` levels (the composer checked)."""
    key = id(node)
    if key in sizes:
        if sizes[key] < 0:
            raise TooLarge(None, None, "an alias refers to the node that holds it", node.start_mark)
        return sizes[key]
    sizes[key] = -1  # in progress
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            size += _expanded_size(k, sizes) + _expanded_size(v, sizes)
    if size > MAX_VALUES:
        raise TooLarge(
            None,
            None,
            f"its aliases expand to more than {MAX_VALUES:,} values (an alias bomb?)",
            node.start_mark,
        )
    sizes[key] = size
    return size


class _StrictLoader(_LimitedLoader):
    """The limited loader, refusing a key given twice in one mapping (the last
    would silently win: ``lr: 0.1`` early in a file, ``lr: 0.5`` later) and a
    key that is a list or mapping (YAML's ``? [a, b]``)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *defaults``: merged (and overridden) by PyYAML itself
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"a {type(key).__name__} as a key; keys must be field names (lr: 0.1)",
                    key_node.start_mark,
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {shown(key)} given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where (PyYAML's own text spans
    several lines, with a pointer under the offending line)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{exc.problem}{where}"
    return " ".join(str(exc).split())


def scalar(text: str) -> Any:
    """A command-line value read as YAML (``5``, ``0.1``, ``null``, ``[1, 2]``);
    text that is not YAML stays the text."""
    if not text.strip():
        return ""
    try:
        return yaml.load(text, Loader=_LimitedLoader)
    except TooLarge as exc:
        raise ConfigError(f"value {shown(text)} is refused: {exc.problem}") from None
    except (yaml.YAMLError, ValueError):  # ValueError: a 5,000-digit integer
        return text.strip()
    except RecursionError:  # the depth limit's backstop
        raise ConfigError(
            f"value {shown(text)} nests too deeply to read; at most {MAX_DEPTH} levels"
        ) from None


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key.sub=value`` (value read as YAML: numbers, null, true...)."""
    if "=" not in text:
        raise ConfigError(
            f"override {shown(text)} must look like field=value (e.g. local_epochs=5)"
        )
    key, raw = text.split("=", 1)
    try:
        return key.strip(), scalar(raw)
    except ConfigError as exc:
        raise ConfigError(f"override '{shown(key.strip())[1:-1]}': {exc}") from None


def override(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    """A copy of ``cfg`` with dotted fields replaced, validated again (the old
    spellings ``cfg`` was given still said in its run's note)."""
    result = from_dict(with_overrides(to_dict(cfg), overrides))
    remember(result, given_old(cfg))
    return result


def dump(cfg: Config) -> str:
    """The resolved config as YAML."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
