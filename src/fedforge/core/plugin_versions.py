"""Which plugin is which, across hosts: a loaded plugin's name and version, so a
deployment's server and clients can tell whether they run the same one.

- a ``.py`` file: its file name, and ``sha256:`` with the first 12 hex digits of
  its content's SHA-256 (the same file at another path is the same plugin);
- a module, or an installed entry point's module: the module's name, and the
  version of the installed distribution that holds it, else its ``__version__``,
  else the digest of its file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fedforge.core import registry

DIGEST_HEX = 12  # hex digits of a file's SHA-256 said as its version


@dataclass(frozen=True)
class PluginId:
    name: str
    version: str


def identify(key: str) -> PluginId:
    """The name and version of the loaded plugin ``key`` (one of
    ``registry.loaded_plugins()``)."""
    module = registry.plugin_module(key)
    is_file = not key.startswith(registry.ENTRY_POINT_KEY) and key != module
    if is_file:
        return PluginId(Path(key).name, file_digest(Path(key)))
    return PluginId(module, module_version(module))


def file_digest(path: Path) -> str:
    """``sha256:`` and the first hex digits of the file's SHA-256 ("unreadable"
    when it cannot be read)."""
    try:
        data = path.read_bytes()
    except OSError:
        return "unreadable"
    return "sha256:" + hashlib.sha256(data).hexdigest()[:DIGEST_HEX]


def module_version(name: str) -> str:
    """The version of the distribution installing module ``name``, else the
    module's ``__version__``, else its file's digest."""
    top = name.partition(".")[0]
    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None)
    if isinstance(version, str) and version:
        return version
    where = getattr(module, "__file__", None)
    return file_digest(Path(where)) if where else "unknown"


def loaded() -> dict[str, PluginId]:
    """Every loaded plugin by its name."""
    ids = (identify(key) for key in registry.loaded_plugins())
    return {p.name: p for p in ids}


def used_plugins(components: Iterable[tuple[str, str | None]]) -> dict[str, tuple[str, str]]:
    """The plugins that registered one of ``components`` (kind, name), each once
    in the order named: its name -> (version, what it provides, e.g.
    ``algorithm 'feddyn'``). A component the caller's own code registered, or a
    built-in, names no plugin."""
    uses: dict[str, list[str]] = {}
    for kind, name in components:
        if name is None or not registry.is_registered(kind, name):
            continue
        key = registry.lookup(kind, name).plugin
        label = f"{kind} {name!r}"
        if key and label not in uses.setdefault(key, []):
            uses[key].append(label)
    out: dict[str, tuple[str, str]] = {}
    for key, what in uses.items():
        plugin = identify(key)
        out[plugin.name] = (plugin.version, ", ".join(what))
    return out
