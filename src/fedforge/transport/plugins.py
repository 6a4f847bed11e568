"""The plugins a deployment's run uses, over the wire: the server names them in
Hello (name, version, the components they registered), a client process checks
them against what it loaded before it builds anything and says its versions in
Join, and the server refuses a join that lacks one or holds another version
(an older client that says none among them), in one line naming the plugin and
both versions. A client and the server run the same plugin or none of the run.

Only the plugins that registered a component the config names count (its
algorithm, aggregator, server optimizer, codecs, model, task): a plugin loaded
but unused is not asked of the clients. A component registered by the caller's
own code rather than a plugin is not named (a client without it is refused
where the config is checked, by the component's name)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import yaml

from fedforge.config import Config
from fedforge.config.names import config_components
from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.core.plugin_versions import loaded, used_plugins
from fedforge.transport.pb import federation_pb2 as pb


def run_plugins(cfg: Config) -> list[pb.Plugin]:
    """The plugins that registered a component ``cfg`` names, each once, in the
    order the config names them."""
    used = used_plugins(config_components(cfg))
    return [pb.Plugin(name=n, version=v, provides=what) for n, (v, what) in used.items()]


def mismatch(wanted: Sequence[pb.Plugin], have: Mapping[str, str], lacking: str) -> str | None:
    """The line for the first plugin of ``wanted`` that ``have`` (name -> version)
    lacks (said as ``lacking``) or holds in another version; None: all there."""
    for p in wanted:
        got = have.get(p.name)
        if got == p.version:
            continue
        used = f"plugin {p.name!r} ({p.provides})"
        if got is None:
            return f"the run uses {used} version {p.version}; {lacking}"
        return (
            f"{used} is version {p.version} on the server and {got} on this client: "
            "run the same plugin on both sides"
        )
    return None


def check_client(wanted: Sequence[pb.Plugin], config_yaml: str) -> list[pb.Plugin]:
    """On a client process, before it builds the run: the config's own plugins
    loaded where they are found on this host, then each plugin the run uses
    checked against those loaded (ConfigError: one missing or of another
    version). Returns this process's versions of them, for Join."""
    for spec in config_plugins(config_yaml):  # a path of the server's host may not be here
        with contextlib.suppress(ConfigError):
            registry.load_plugin(spec)
    have = {name: p.version for name, p in loaded().items()}
    why = mismatch(
        wanted,
        have,
        "this client has not loaded it: start it with --plugin FILE_OR_MODULE (the same version)",
    )
    if why is not None:
        raise ConfigError(why)
    return [pb.Plugin(name=p.name, version=have[p.name], provides=p.provides) for p in wanted]


def join_refusal(wanted: Sequence[pb.Plugin], said: Sequence[pb.Plugin]) -> str | None:
    """On the server: why a join whose process said ``said`` is refused (None: it
    holds every plugin the run uses, in the same version)."""
    lacking = "the joining client process did not say it has it (a fedforge client "
    lacking += "that says no plugins in Join is older than plugin checks: update it)"
    return mismatch(wanted, {p.name: p.version for p in said}, lacking)


def config_plugins(config_yaml: str) -> list[str]:
    """The ``plugins`` field of a config sent as YAML (none when it has none)."""
    with contextlib.suppress(yaml.YAMLError):
        data = yaml.safe_load(config_yaml)
        plugins = data.get("plugins") if isinstance(data, dict) else None
        if isinstance(plugins, list):
            return [p for p in plugins if isinstance(p, str)]
    return []
