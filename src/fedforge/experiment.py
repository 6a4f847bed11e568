"""Everything a run is made of, built from a config: data, partition, model,
algorithm, pipeline and engine. The round loop only drives it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedforge import algorithms, communication, privacy
from fedforge.algorithms.base import Algorithm
from fedforge.client import ClientRuntime
from fedforge.communication import CommunicationParts
from fedforge.config import Config
from fedforge.data import Partition, load_mnist, make_partition
from fedforge.engines import Engine
from fedforge.engines.serial import SerialEngine
from fedforge.engines.vectorized import VectorizedEngine, unsupported_reason
from fedforge.models import build_model
from fedforge.params import ParamSpec
from fedforge.pipeline import Pipeline
from fedforge.privacy import PrivacyParts
from fedforge.robust import RobustParts, assemble

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class FederatedData:
    """A training set split over clients, and the held-out test set."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    partition: Partition

    def client_data(self, client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.tensor(self.partition.client_indices[client_id])
        return self.train_x[idx], self.train_y[idx]

    def num_examples(self, client_id: int) -> int:
        return len(self.partition.client_indices[client_id])


def load_federated_data(cfg: Config) -> FederatedData:
    """The configured data set, cast to the run's dtype and partitioned."""
    mnist = load_mnist(cfg.data_dir)
    dtype = DTYPES[cfg.dtype]
    labels = mnist.train_y.numpy()
    partition = make_partition(cfg.partition, cfg.num_clients, labels, cfg.seed)
    return FederatedData(
        mnist.train_x.to(dtype), mnist.train_y, mnist.test_x.to(dtype), mnist.test_y, partition
    )


@dataclass
class Experiment:
    """The parts of one run."""

    cfg: Config
    data: FederatedData
    model: nn.Module
    spec: ParamSpec
    algorithm: Algorithm
    pipeline: Pipeline
    engine: Engine
    initial_params: torch.Tensor
    note: str | None = None  # a one-line remark for the user (e.g. an engine fallback)
    robust: RobustParts | None = None  # aggregator, attackers and gates of cfg.robust
    comm: CommunicationParts | None = None  # codecs, residuals, groups of cfg.communication
    privacy: PrivacyParts | None = None  # DP stages, accountant, secure aggregation


def build(cfg: Config, data: FederatedData | None = None) -> Experiment:
    """Assemble a run from its config (``data`` may be given to reuse a load)."""
    data = data if data is not None else load_federated_data(cfg)
    dtype = DTYPES[cfg.dtype]
    model = build_model(cfg.model, cfg.seed, dtype)
    spec = ParamSpec.of(model)
    algorithm = algorithms.from_config(cfg)
    robust = assemble(cfg, data.client_data)
    comm = communication.assemble(cfg, spec, dtype, data.partition, data.train_y)
    sizes = [data.num_examples(c) for c in range(cfg.num_clients)]
    priv = privacy.assemble(cfg, sizes)
    pipeline = Pipeline(
        aggregator=priv.aggregator or robust.aggregator,
        client=(*comm.client_stages, *priv.client_stages, *robust.client_stages),
        codec=comm.uplink,
        cohort=robust.cohort_stages,
        server_aggregate=priv.aggregate_stages,
    )
    communication.check_pipeline(cfg, pipeline)
    runtime = ClientRuntime(
        model,
        spec,
        algorithm,
        robust.data_fn,
        pipeline.client,
        pipeline.codec,
        gate=robust.gate,
        tamper_fn=robust.tamper_fn,
        downlink=comm.downlink,
    )
    engine, note = make_engine(cfg.engine, runtime)
    params = spec.flatten(model, dtype)
    return Experiment(
        cfg, data, model, spec, algorithm, pipeline, engine, params, note, robust, comm, priv
    )


def make_engine(name: str, runtime: ClientRuntime) -> tuple[Engine, str | None]:
    """The engine a config asks for, or the serial engine with the reason why the
    asked one cannot run this model."""
    if name == "vectorized":
        reason = unsupported_reason(runtime.model)
        if reason is None:
            return VectorizedEngine(runtime), None
        return SerialEngine(runtime), f"engine: vectorized cannot run this model ({reason}); serial"
    return SerialEngine(runtime), None
