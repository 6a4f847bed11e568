"""The components a config names, found in the registry (core/registry.py): which
field names which kind, the check that every name is registered and every
plugin's options parse, and :func:`make`, the one way ``build`` turns a name
into a component.

A plugin's options travel under ``plugin_options``, by the plugin's name
(``plugin_options: {fedavgm: {server_momentum: 0.9}}``): one mapping that reads
as the list of what the plugins were given, cannot collide with a built-in
section, and is parsed by the plugin's options dataclass exactly as a built-in
section is (types, defaults, ``check()``), with the same one-line errors
(``config field 'plugin_options.fedavgm.server_momentum' = ...``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedforge.config.names import check_registered, named
from fedforge.config.parse import build_section
from fedforge.config.schema import Config
from fedforge.core import registry
from fedforge.core.errors import ConfigError, invalid_field

if TYPE_CHECKING:
    import torch

    from fedforge.core.params import ParamSpec


@dataclass(frozen=True)
class ComponentContext:
    """What a factory is called with: the run's config, the name it was looked up
    by (one factory may serve several names: ``adam``/``yogi``), its parsed
    options (an instance of the options dataclass it registered, or None), and
    for the kinds that size state by the model (algorithms, codecs) the
    parameter spec and the run's dtype."""

    cfg: Config
    name: str
    options: Any = None
    spec: ParamSpec | None = None
    dtype: torch.dtype | None = None


def check_names(cfg: Config) -> None:
    """Refuse in one line a name nobody registered (checked with the config too),
    a plugin's options that do not parse, and options for no component in use."""
    check_registered(cfg)
    taking: dict[str, registry.Entry] = {}
    for kind, field, name in named(cfg):
        entry = registry.lookup(kind, name, field)
        if entry.options is not None:
            taking[name] = entry
    for name in cfg.plugin_options:
        if name not in taking:
            raise invalid_field(
                f"plugin_options.{name}",
                cfg.plugin_options[name],
                "names no component of this run that declares options; "
                f"those that do: {', '.join(taking) or 'none'}",
            )
    for entry in taking.values():
        options_of(cfg, entry)


def options_of(cfg: Config, entry: registry.Entry) -> Any:
    """The parsed options of ``entry`` from ``cfg.plugin_options`` (its defaults
    when the config gives none); None for a component without options."""
    options = entry.load_options()
    if options is None:
        return None
    given = cfg.plugin_options.get(entry.name, {})
    return build_section(options, given, f"plugin_options.{entry.name}.")


def make(
    kind: str,
    name: str,
    cfg: Config,
    field: str | None = None,
    spec: ParamSpec | None = None,
    dtype: torch.dtype | None = None,
) -> Any:
    """The ``kind`` component ``name`` built for ``cfg`` by its registered factory."""
    entry = registry.lookup(kind, name, field)
    context = ComponentContext(cfg, name, options_of(cfg, entry), spec, dtype)
    component = entry.load()(context)
    if component is None:
        raise ConfigError(f"{kind} {name!r}: its factory ({entry.origin}) returned None")
    return component
