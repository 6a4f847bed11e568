"""A run's communication parts, assembled from its ``communication:`` section: the uplink
codec (with error feedback and its per-client residual store), the downlink
codec, the clipping stage and the client groups of hierarchical aggregation.

Reduced upload frequency (``upload_every`` = k) is a property of the round loop
(``server/round.py``): a cohort is sampled for a period of k rounds, trains k
rounds locally from the payload of the period's first round and uploads once,
at the period's last round. Clients not sampled stay idle, as offline devices
do; resampling every round would leave a re-sampled client training on a stale
local model and need an [N, P] table of local models.

Refuses at build time what needs the built pipeline: hierarchical aggregation
needs a streaming (linear) aggregator without cohort stages. What the config
alone rules out is refused when it is checked (config/compat.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedforge.communication.feedback import ErrorFeedback
from fedforge.communication.groups import assign_groups
from fedforge.communication.shared import SharedPart, shared_spec
from fedforge.config import CommunicationConfig, Config
from fedforge.config.components import make
from fedforge.core.errors import ConfigError
from fedforge.core.params import ParamSpec
from fedforge.data import Partition
from fedforge.pipeline.pipeline import Codec, Pipeline, Stage
from fedforge.store.client_state import ClientStateStore, make_state_store, working_dir


@dataclass(frozen=True)
class CommunicationParts:
    """What ``build`` puts into the pipeline, the client runtime and the loop."""

    uplink: Codec
    downlink: Codec | None  # None: the payload carries the parameters as they are
    client_stages: tuple[Stage, ...]  # placed first, right after local training
    client_state: ClientStateStore | None  # error-feedback residuals, saved by checkpoints
    group_of: tuple[int, ...] | None  # hierarchical aggregation: each client's group


def make_codec(name: str, cfg: Config, spec: ParamSpec, field: str) -> Codec:
    """The codec ``name`` (config field ``field``), built by its registered factory."""
    codec: Codec = make("codec", name, cfg, field, spec)
    return codec


def assemble(
    cfg: Config,
    spec: ParamSpec,
    dtype: torch.dtype,
    partition: Partition,
    labels: torch.Tensor,
    kept: torch.Tensor | None = None,
) -> CommunicationParts:
    """The communication parts of ``cfg.communication``; ``kept``: the [P] mask of
    the entries each client keeps for itself (none of them is sent)."""
    com, num_clients = cfg.communication, cfg.num_clients
    local = kept if kept is not None and bool(kept.any()) else None
    sent = spec if local is None else shared_spec(spec, local)
    uplink = make_codec(com.uplink, cfg, sent, "communication.uplink")
    store = None
    if com.error_feedback:
        where = working_dir("residual")  # a working file only: checkpoints hold the rows
        store = make_state_store(num_clients, sent.size, dtype, where, remove_dir=True)
        uplink = ErrorFeedback(uplink, store)
    if local is not None:
        uplink = SharedPart.outside(uplink, local)
    downlink = (
        None
        if com.downlink == "dense"
        else make_codec(com.downlink, cfg, spec, "communication.downlink")
    )
    stages: tuple[Stage, ...] = ()
    if com.clip_norm is not None:  # the stage registered as "clip"
        stages = (make("stage", "clip", cfg, spec=spec, dtype=dtype),)
    groups = None
    if com.groups:
        groups = tuple(assign_groups(com.group_by, com.groups, partition, labels.numpy()))
    return CommunicationParts(uplink, downlink, stages, store, groups)


def check_pipeline(communication: CommunicationConfig, pipeline: Pipeline) -> None:
    """Refuse edge groups the pipeline cannot stream."""
    if communication.groups and not pipeline.streams:
        raise ConfigError(
            f"communication.groups = {communication.groups} (hierarchical aggregation) "
            f"needs the weighted mean without cohort stages; the pipeline has aggregator "
            f"'{pipeline.aggregator.name}' and {len(pipeline.cohort)} cohort stage(s). "
            "Set communication.groups = 0 or robust.aggregator = mean without gates"
        )
