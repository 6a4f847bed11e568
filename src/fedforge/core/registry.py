"""The one registry: every component a config names, found by its kind and name.

A component is a *factory* registered under ``(kind, name)``; ``build`` asks the
registry for the factory and calls it with what that kind's factories take
(documented by each kind's ``register_*`` helper and its factory ``Protocol``).
The built-ins are registered through :func:`register` like anyone's component
(``core/builtins.py``), each factory named by ``"module:attribute"`` text and
imported only when a run looks it up: the registry itself imports nothing
heavy, so a config's names are checked without torch.

Before the first question the registry registers the built-ins and then loads
the ``fedforge.plugins`` entry points of the installed distributions, once;
:func:`load_plugin` imports a module by name or a ``.py`` file by path (the
``--plugin`` option and the config's ``plugins`` field).

A plugin declares its options as a dataclass (``options=``): fields with types
and defaults, and an optional ``check()`` that raises ConfigError; the config
carries them under ``plugin_options: {NAME: {field: value}}`` and parses them
exactly as a built-in section (config/plugins.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import sys
import threading
import zlib
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedforge.core.errors import ConfigError

# the kinds of component a config names (a config field names one of each kind)
KINDS = (
    "algorithm",
    "aggregator",
    "server_optimizer",
    "codec",
    "stage",
    "selection",
    "lr_rule",
    "metric",
    "model",
    "task",
)
ENTRY_POINT_GROUP = "fedforge.plugins"
ENTRY_POINT_KEY = "entry point "  # how an entry point's key in loaded_plugins() starts


@dataclass(frozen=True)
class Entry:
    """One registered component. ``factory``: the callable, or ``"module:attr"``
    text naming it (imported on first use); ``options``: the dataclass of the
    component's config options (or ``"module:attr"`` text naming it), or None;
    ``origin``: who registered it (a module, a file or an entry point), said in
    errors and by ``names``;
    ``plugin``: the plugin whose import registered it (its key in
    :func:`loaded_plugins`), "" for the built-ins and a caller's own code."""

    kind: str
    name: str
    factory: Callable[..., Any] | str
    options: type | str | None = None
    origin: str = ""
    plugin: str = ""

    def load(self) -> Callable[..., Any]:
        """The factory itself (its module imported now when given as text)."""
        if callable(self.factory):
            return self.factory
        module, _, attr = self.factory.partition(":")
        value = importlib.import_module(module)
        for part in attr.split("."):
            value = getattr(value, part)
        if not callable(value):
            raise TypeError(f"{self.kind} {self.name!r}: {self.factory} is not callable")
        return value

    def load_options(self) -> type | None:
        """The options dataclass (its module imported now when given as text)."""
        if not isinstance(self.options, str):
            return self.options
        module, _, attr = self.options.partition(":")
        value = getattr(importlib.import_module(module), attr)
        if not (isinstance(value, type) and dataclasses.is_dataclass(value)):
            raise TypeError(f"{self.kind} {self.name!r}: {self.options} is not a dataclass")
        return value


_entries: dict[tuple[str, str], Entry] = {}
_lock = threading.RLock()
_ready = False  # built-ins registered and entry points loaded
_broken: ConfigError | None = None  # an entry point that failed to load, said each time
_loaded: dict[str, str] = {}  # plugin module or resolved file -> the module's name
_importing: list[str] = []  # the plugins being imported now, innermost last


# a plugin loaded from a .py file is the module FILE_PLUGIN_PREFIX + its stem + a hash
FILE_PLUGIN_PREFIX = "fedforge_plugin_"


def register(
    kind: str,
    name: str,
    factory: Callable[..., Any] | str,
    *,
    options: type | str | None = None,
    replace: bool = False,
) -> None:
    """Register ``factory`` as the ``kind`` component called ``name``, the name a
    config gives (``options``: its options dataclass, or ``"module:attr"`` text
    naming it, imported when a config's options are parsed). Raises ConfigError
    for an unknown kind, an empty name, options that are not a dataclass, or a
    name already taken (unless ``replace``)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown component kind {kind!r}; kinds: {', '.join(KINDS)}")
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ConfigError(f"a {kind} needs a non-empty name without surrounding spaces")
    if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
        raise ConfigError(f"{kind} {name!r}: the factory must be callable or 'module:attr' text")
    if options is not None and not (
        (isinstance(options, type) and dataclasses.is_dataclass(options))
        or (isinstance(options, str) and ":" in options)
    ):
        raise ConfigError(f"{kind} {name!r}: options must be a dataclass type")
    with _lock:
        _ensure_ready()
        old = _entries.get((kind, name))
        if old is not None and not replace:
            raise ConfigError(
                f"{kind} {name!r} is already registered (by {old.origin or 'fedforge'}); "
                "pass replace=True to replace it"
            )
        plugin = _importing[-1] if _importing else ""
        _entries[(kind, name)] = Entry(kind, name, factory, options, _origin(factory), plugin)


def unregister(kind: str, name: str) -> None:
    """Forget the ``kind`` component ``name`` (tests; a no-op if unknown)."""
    with _lock:
        _entries.pop((kind, name), None)


def lookup(kind: str, name: str, field: str | None = None) -> Entry:
    """The entry of the ``kind`` component ``name``; an unknown name raises one
    line naming the kind (or the config ``field``), the name and the names known."""
    with _lock:
        _ensure_ready()
        entry = _entries.get((kind, name))
    if entry is None:
        raise ConfigError(unknown(kind, name, field))
    return entry


def names(kind: str) -> tuple[str, ...]:
    """The registered names of ``kind``, built-ins first, in registration order."""
    with _lock:
        _ensure_ready()
        return tuple(n for k, n in _entries if k == kind)


def is_registered(kind: str, name: str) -> bool:
    with _lock:
        _ensure_ready()
        return (kind, name) in _entries


def is_builtin(kind: str, name: str) -> bool:
    """Whether ``name`` is registered now as fedforge's own ``kind`` (a built-in
    that no plugin replaced)."""
    from fedforge.core import builtins

    with _lock:
        _ensure_ready()
        entry = _entries.get((kind, name))
    return entry is not None and builtins.is_builtin(kind, name, entry.factory)


def unknown(kind: str, name: object, field: str | None = None) -> str:
    """The one-line message for a ``kind`` name nobody registered."""
    from fedforge.core.errors import shown

    known = ", ".join(repr(n) for n in names(kind)) or "none"
    allowed = (
        f"must be a registered {kind}: {known} (or your own: fedforge.register_{kind}, "
        "loaded by --plugin or the config's plugins)"
    )
    if field:
        return f"config field '{field}' = {shown(name)} is invalid: {allowed}"
    return f"{kind} {shown(name)} is unknown: {allowed}"


def load_plugin(spec: str) -> str:
    """Import the plugin ``spec`` once: a module name (``my_pkg.fedprox``) or the
    path of a ``.py`` file; importing it registers its components. Returns the
    module's name. Raises ConfigError naming ``spec`` when it cannot be imported."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"plugin {spec!r}: give a module name or the path of a .py file")
    is_file = spec.endswith(".py") or "/" in spec or "\\" in spec
    key = str(Path(spec).resolve()) if is_file else spec
    with _lock:
        _ensure_ready()
        if key in _loaded:
            return _loaded[key]
        _importing.append(key)
        try:
            module_name = _import_file(spec, Path(key)) if is_file else _import_module(spec)
        finally:
            _importing.pop()
        _loaded[key] = module_name
        return module_name


def load_plugins(specs: tuple[str, ...] | list[str]) -> None:
    for spec in specs:
        load_plugin(spec)


def loaded_plugins() -> tuple[str, ...]:
    """The plugin modules and files loaded so far (entry points too), in order."""
    with _lock:
        return tuple(_loaded)


def plugin_module(key: str) -> str:
    """The module name of the loaded plugin ``key`` (one of :func:`loaded_plugins`)."""
    with _lock:
        return _loaded[key]


def _import_file(spec: str, path: Path) -> str:
    if not path.is_file():
        raise ConfigError(f"plugin {spec!r}: no such file {str(path)!r}")
    module_name = FILE_PLUGIN_PREFIX + "".join(c if c.isalnum() else "_" for c in path.stem)
    module_name += f"_{zlib.crc32(str(path).encode()):08x}"  # the same in every process
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError(f"plugin {spec!r}: {str(path)!r} cannot be imported as Python")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up
    try:
        loader_spec.loader.exec_module(module)
    except ConfigError:
        sys.modules.pop(module_name, None)
        raise
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ConfigError(f"plugin {spec!r} failed to import: {type(exc).__name__}: {exc}") from exc
    return module_name


def _import_module(spec: str) -> str:
    try:
        importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name is not None and spec.startswith(exc.name):
            raise ConfigError(
                f"plugin {spec!r}: no module named {exc.name!r} (give an importable module "
                "or the path of a .py file)"
            ) from exc
        raise ConfigError(f"plugin {spec!r} failed to import: {exc}") from exc
    return spec


def _origin(factory: Callable[..., Any] | str) -> str:
    if isinstance(factory, str):
        return factory.partition(":")[0]
    return getattr(factory, "__module__", "") or ""


def _ensure_ready() -> None:
    """Register the built-ins, then load the installed entry points: once, before
    the first question (the lock is held)."""
    global _ready, _broken
    if _ready:
        if _broken is not None:  # every question, not the first alone
            raise _broken
        return
    _ready = True  # set first: the built-ins and plugins call register themselves
    from fedforge.core import builtins

    builtins.register_builtins(register)
    _broken = _load_entry_points()
    if _broken is not None:
        raise _broken


def _load_entry_points() -> ConfigError | None:
    """Each ``fedforge.plugins`` entry point: a module (imported: it registers) or
    a callable (called with no argument: it registers). All are tried; the first
    that fails is returned, and the registry answers nothing while it stands (a
    component missing without a word would run something else)."""
    first: ConfigError | None = None
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{ENTRY_POINT_KEY}{point.name} ({point.value})"
        _importing.append(key)  # what it registers is its
        try:
            value = point.load()
            if callable(value) and not isinstance(value, type(sys)):
                value()
        except Exception as exc:
            first = first or ConfigError(
                f"plugin entry point {point.name!r} ({point.value}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            )
            continue
        finally:
            _importing.pop()
        _loaded[key] = point.value.partition(":")[0]
    return first


def reset_for_tests() -> None:
    """Forget everything: the next question registers the built-ins and reads the
    entry points again (tests that install an entry point)."""
    global _ready, _broken
    with _lock:
        _entries.clear()
        _loaded.clear()
        _ready, _broken = False, None


class KindView(MutableMapping[str, Any]):
    """The registered components of one kind as a mapping, name -> factory (its
    ``"module:attr"`` text loaded): setting a name registers it (replacing),
    deleting one unregisters it. ``register_model``'s and ``register_task``'s
    tables are such views, so that they live in the one registry."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __getitem__(self, name: str) -> Any:
        if not is_registered(self.kind, name):
            raise KeyError(name)
        return lookup(self.kind, name).load()

    def __setitem__(self, name: str, factory: Any) -> None:
        register(self.kind, name, factory, replace=True)

    def __delitem__(self, name: str) -> None:
        if not is_registered(self.kind, name):
            raise KeyError(name)
        unregister(self.kind, name)

    def __iter__(self) -> Iterator[str]:
        return iter(names(self.kind))

    def __len__(self) -> int:
        return len(names(self.kind))


def view(kind: str) -> KindView:
    """The components of ``kind`` as a mapping (see :class:`KindView`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown component kind {kind!r}")
    return KindView(kind)
