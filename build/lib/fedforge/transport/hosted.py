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
thread, so a task gives the same bytes as in simulation.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import yaml

from fedforge.config import Config
from fedforge.config.parse import from_dict, override
from fedforge.core.dataspec import DataSpec
from fedforge.core.errors import ConfigError
from fedforge.data.federated import DTYPES
from fedforge.data.folder import ClientFolder, own_data
from fedforge.engines.threads import set_threads
from fedforge.server.experiment import Experiment, build


def client_config(config_yaml: str, device: str) -> Config:
    """The server's config as this process runs it: one client at a time, serially,
    on one thread, on ``device``; without ``client_tags`` (a CSV on the server's
    host, read by its per-tag evaluation alone)."""
    cfg = from_dict(yaml.safe_load(config_yaml))
    local = {"engine": "serial", "workers": 1, "threads": 1, "device": device}
    return override(cfg, {**local, "client_tags": None})


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


def evaluation_data(exp: Experiment, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What client ``client_id`` is evaluated on (cold start, canary): its own
    held-out examples when it brought some (``test.npz``), else its training data."""
    data = exp.data
    if data.hosted is not None:
        x, y = data.holdout_data(client_id)
        if len(y):
            return x, y
    return data.client_data(client_id)
