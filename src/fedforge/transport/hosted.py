"""What a client process trains on: the run's experiment, built on its side from
the config the server sent, in one of the two ways ``deployment.client_data``
says:

- ``partition`` (``fedforge client --clients IDS``): the config's data set is
  loaded and partitioned as the simulator does; the process trains its ids' parts.
- ``remote`` (``fedforge client --data PATH --client-id N``): no data set is
  loaded; the folder's examples (``data/folder.py``), checked against the data
  spec the server sent in Hello, are client N's (with several ids, each its
  own folder's), and every other client's rows are held elsewhere. The model
  is sized by that spec, not by the local labels (a client may hold fewer
  classes than the federation).

Either way the runtime is the simulator's, on the serial engine and one torch
thread, so a task gives the same bytes as in simulation, save the privacy
noise: a client draws it from the operating system, whatever the server's
config says, unless its operator trusts the server with it
(``--trust-server-noise``): the server knows the run seed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import torch
import yaml

from fedforge.config import Config
from fedforge.config.overrides import with_overrides
from fedforge.config.parse import from_dict, override
from fedforge.config.privacy import client_privacy
from fedforge.core import wire
from fedforge.core.dataspec import DataSpec
from fedforge.core.errors import ConfigError
from fedforge.data.federated import DTYPES
from fedforge.data.folder import ClientFolder, own_data
from fedforge.engines.threads import set_threads
from fedforge.evaluation.evaluate import evaluate
from fedforge.privacy.dp import ClientNoise
from fedforge.server.experiment import Experiment, build
from fedforge.transport.logs import log_event


def client_config(config_yaml: str, device: str, trust_server_noise: bool = False) -> Config:
    """The server's config as this process runs it: one client at a time, serially,
    on one thread, on ``device``; without ``evaluation.client_tags`` (a CSV on the server's
    host, read by its per-tag evaluation alone); its privacy noise from the OS
    unless its operator trusts the server with it (``config/privacy.py``:
    ``client_privacy``; a line when that overrides the server's config). The
    config's ``plugins`` are left out: paths of the server's host, and the run's
    plugins are loaded here already (``plugins.py:check_client``)."""
    cfg = from_dict(with_overrides(yaml.safe_load(config_yaml), {"plugins": []}))
    privacy, said = client_privacy(cfg.privacy, trust_server_noise)
    if said is not None:
        log_event("client", "noise_kept_secret", warning=said)
    local = {"engine": "serial", "workers": 1, "threads": 1, "device": device}
    # each client's lr comes in its work's plan: the rule, its options and any file
    # it reads are the server's
    rule = cfg.local.lr_rule
    options = {k: v for k, v in cfg.plugin_options.items() if k != rule}
    server_side = {
        "evaluation.client_tags": None,
        "local.lr_rule": None,
        "local.lr_rule_scales_bounds": False,  # the scaled clip bound comes in the plan too
        "plugin_options": options,
    }
    return override(cfg, {**local, **server_side, "privacy.secret_noise": privacy.secret_noise})


def build_hosted(
    cfg: Config, ids: list[int], folders: Mapping[int, ClientFolder] | None, spec_json: str
) -> Experiment:
    """The experiment of the clients ``ids`` on this side: on the simulator's
    partition (``folders`` None) or on each one's own examples (``folders``)."""
    bad = [c for c in ids if not 0 <= c < cfg.num_clients]
    if bad:
        raise ConfigError(
            f"client ids {bad} are outside this federation's 0..{cfg.num_clients - 1}"
        )
    remote = cfg.deployment.client_data == "remote"
    if folders is None and remote:
        raise ConfigError(
            "the server's clients bring their own data (deployment.client_data: remote): "
            "join with --data PATH --client-id N"
        )
    if folders is not None and not remote:
        raise ConfigError(
            "the server trains on the simulator's partition (deployment.client_data: "
            "partition): join with --clients IDS, not --data"
        )
    if folders is None:
        exp = build(cfg)
    else:
        if not spec_json:
            raise ConfigError("the server sent no data spec to check --data against")
        spec = DataSpec.from_json(spec_json)
        exp = build(cfg, own_data(folders, spec, DTYPES[cfg.dtype], cfg.num_clients))
    # build only plans the threads (the simulator's loop applies them): without
    # this the process trains on torch's default, every core, and a host's
    # client processes oversubscribe its cores with spinning OpenMP threads
    set_threads(1)
    return exp


def check_noise_floor(exp: Experiment, ids: list[int], floor: float) -> None:
    """Refuse to train clients ``ids`` unless each adds privacy noise of at least
    ``floor`` times its clip bound on this side (``fedforge client
    --min-noise-multiplier``): the server's config decides the mechanism, and a
    server that wants a client's clean update need only send one without noise."""
    if floor <= 0:
        return
    noises = [s for s in exp.pipeline.client if isinstance(s, ClientNoise)]
    added = {c: math.sqrt(sum(n.multiplier_for(c) ** 2 for n in noises)) for c in ids}
    below = {c: z for c, z in added.items() if z < floor}
    if below:
        p = exp.cfg.privacy
        got = ", ".join(f"client {c}: {z:g}" for c, z in sorted(below.items()))
        tiers = "on" if p.tiers.enabled else "off"
        raise ConfigError(
            f"--min-noise-multiplier {floor:g}: the server's config (privacy.dp = '{p.dp}', "
            f"noise_multiplier = {p.noise_multiplier:g}, tiers {tiers}) "
            f"has this process's clients add noise of less than {floor:g} times the clip "
            f"bound ({got}); they do not join"
        )


def evaluation_data(exp: Experiment, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What client ``client_id`` is evaluated on (cold start, canary): its own
    held-out examples when it brought some (``test.npz``), else its training data."""
    data = exp.data
    if data.hosted is not None:
        x, y = data.holdout_data(client_id)
        if len(y):
            return x, y
    return data.client_data(client_id)


def evaluation_report(exp: Experiment, client_id: int, payload: bytes) -> bytes:
    """The scores of the model in ``payload`` on client ``client_id``'s evaluation
    data (``evaluation_data``), as the JSON report an EVALUATE is answered with."""
    params = wire.decode(payload).tensors["params"]
    x, y = evaluation_data(exp, client_id)
    ev = evaluate(exp.model, exp.spec, params, x, y, exp.cfg.evaluation.batch_size, exp.metrics)
    report = {"accuracy": ev.accuracy, "loss": ev.loss, "num_examples": int(len(y))}
    return json.dumps(report).encode()
