"""Simulated Byzantine clients: who attacks, and what each attack does.

Runs only in simulation, where the framework plays the attackers; a real
deployment has no such module on its clients. Attackers are a fixed set of
``round(fraction * num_clients)`` client ids drawn from (seed, "attackers"):
the same for every round, engine and rerun. Each attack acts where a real
attacker would:

- data: ``label_flip`` trains on labels c -> C - 1 - c (Fang et al. 2020; Tolpegin
  et al. 2020);
- the delta, as the last client stage before the codec (after any clipping or
  noise: an attacker does not apply the protocol's stages, its delta replaces
  what they would send): ``sign_flip`` sends -delta (Damaskinos
  et al. 2018), ``scaled`` sends scale * delta (model replacement, Bagdasaryan
  et al. 2020), ``gaussian`` sends N(0, std^2) noise (Blanchard et al. 2017),
  ``nan_inf`` sends NaN and +inf values, ``uint8_values`` sends its delta
  min-max quantised to uint8 and cast back to floats without the scale: values
  0..255 of the delta's own length and dtype (the same-length variant of the
  encoding accident below; a well-formed upload that only its size gives away);
- the encoding: ``uint8`` is the accident of a client that quantises its update
  to uint8 and ships the raw bytes under the float tensor's name (the header
  says float, the shape is a quarter of the model's in float32, an eighth in
  float64): it really crosses the wire
  and the server's codec refuses it;
- colluding, at the server: ``alie`` ("A Little Is Enough", Baruch, Baruch,
  Goldberg, NeurIPS 2019) sends mean - z * std of the honest updates, per
  coordinate; ``ipm`` (inner-product manipulation, Xie, Koyejo, Gupta, UAI 2020)
  sends -epsilon * mean of the honest updates. Their knowledge of the honest
  updates is simulated by a cohort stage (:class:`Collusion`) that rewrites the
  attackers' rows before any cohort validation; it exists only in simulation.

Faults that come and go: with ``probability`` p < 1 an attacker misbehaves only
in some rounds, each (round, client) drawn from (seed, "fault", round, client)
with chance p (:func:`faulty`), the same for every engine and rerun; in the
other rounds it is an honest client.
"""

from __future__ import annotations

import statistics
from typing import Literal

import torch

from fedforge.client.runtime import TamperFn
from fedforge.core.errors import ConfigError
from fedforge.core.rng import numpy_rng, torch_generator
from fedforge.data.federated import ClientDataFn as DataFn
from fedforge.pipeline.codec import CodecContext
from fedforge.pipeline.constraints import FirstCohortStage
from fedforge.pipeline.pipeline import (
    Codec,
    CohortRole,
    CohortUpdates,
    Constraint,
    Role,
    StageContext,
    Where,
)

DeltaKind = Literal["sign_flip", "scaled", "gaussian", "nan_inf", "uint8_values"]
CollusionKind = Literal["alie", "ipm"]


def attacker_ids(num_clients: int, fraction: float, seed: int) -> frozenset[int]:
    """The ids of the ``round(fraction * num_clients)`` attackers of a run."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"attacker fraction {fraction!r} is invalid: must be in [0, 1]")
    count = round(fraction * num_clients)  # half to even: 0.25 x 10 is 2
    if fraction > 0 and count == 0:
        raise ConfigError(
            f"robust.attack_fraction = {fraction} of {num_clients} clients rounds to no "
            f"attacker (round(fraction x N) = 0); raise it above {0.5 / num_clients:.3g}"
        )
    rng = numpy_rng(seed, "attackers")
    return frozenset(int(c) for c in rng.choice(num_clients, size=count, replace=False))


def faulty(
    attackers: frozenset[int], probability: float, seed: int, round_idx: int, client_id: int | None
) -> bool:
    """Whether ``client_id`` misbehaves in ``round_idx``: an attacker, and (for
    ``probability`` < 1) its seeded draw for the round falls under ``probability``."""
    if client_id is None or client_id not in attackers:
        return False
    if probability >= 1.0:
        return True
    return bool(numpy_rng(seed, "fault", round_idx, client_id).random() < probability)


def flipped_labels_fn(data_fn: DataFn, attackers: frozenset[int], num_classes: int) -> DataFn:
    """``data_fn`` whose attackers see every label c as ``num_classes - 1 - c``."""

    def client_data(client_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = data_fn(client_id)
        return (x, num_classes - 1 - y) if client_id in attackers else (x, y)

    return client_data


class DeltaAttack:
    """A client stage that rewrites the attackers' deltas (others pass unchanged)."""

    where: Where = "client"
    role: Role = "attack"
    linear = True  # an attacker may send anything; it does not constrain the stages
    constraints = ()

    def __init__(
        self,
        kind: DeltaKind,
        attackers: frozenset[int],
        scale: float = 10.0,
        std: float = 1.0,
        probability: float = 1.0,
    ) -> None:
        self.name = f"attack:{kind}"
        self.kind, self.attackers, self.scale, self.std = kind, attackers, scale, std
        self.probability = probability

    def apply(self, vec: torch.Tensor, ctx: StageContext) -> torch.Tensor:
        client = ctx.client_id
        if client is None or not faulty(
            self.attackers, self.probability, ctx.seed, ctx.round_idx, client
        ):
            return vec
        if self.kind == "sign_flip":
            return -vec
        if self.kind == "scaled":
            return self.scale * vec
        if self.kind == "gaussian":
            gen = torch_generator(ctx.seed, "attack", ctx.round_idx, client)
            return self.std * torch.randn(vec.shape, generator=gen, dtype=vec.dtype)
        if self.kind == "uint8_values":
            return uint8_values(vec).to(vec.dtype)
        bad = torch.full_like(vec, float("nan"))
        bad[::2] = float("inf")
        return bad


def uint8_values(vec: torch.Tensor) -> torch.Tensor:
    """``vec`` min-max quantised to uint8: its minimum 0, its maximum 255."""
    lo, hi = vec.min(), vec.max()
    span = (hi - lo) if hi > lo else torch.ones((), dtype=vec.dtype)
    return ((vec - lo) / span * 255).round().to(torch.uint8)


def uint8_bytes(vec: torch.Tensor) -> torch.Tensor:
    """``vec`` min-max quantised to uint8, its bytes reinterpreted as ``vec``'s float
    dtype (zero-padded to whole elements): what the server receives."""
    q = uint8_values(vec)
    item = vec.element_size()
    padded = torch.zeros(-(-q.numel() // item) * item, dtype=torch.uint8)
    padded[: q.numel()] = q
    return padded.view(vec.dtype)


def uint8_tamper(attackers: frozenset[int], probability: float = 1.0) -> TamperFn:
    """The encoding accident: every float tensor an attacker's codec produced goes
    out as the uint8 bytes of :func:`uint8_bytes` (in the rounds it is faulty)."""

    def tamper(tensors: dict[str, torch.Tensor], ctx: StageContext) -> dict[str, torch.Tensor]:
        if not faulty(attackers, probability, ctx.seed, ctx.round_idx, ctx.client_id):
            return tensors
        return {k: uint8_bytes(t) if t.is_floating_point() else t for k, t in tensors.items()}

    return tamper


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z_max for n clients of which f collude: the largest shift
    (in standard deviations) that still leaves s = floor(n/2 + 1) - f honest
    clients farther from the mean than the attackers, z = Phi^-1((n - s) / n)."""
    s = n // 2 + 1 - f
    p = min(max((n - s) / n, 1e-6), 1 - 1e-6)
    return statistics.NormalDist().inv_cdf(p)


class Collusion:
    """Simulation only: the colluding attackers' rows of the cohort, rewritten from
    the honest rows' statistics before any cohort validation. Never refuses. With a
    lossy uplink ``codec`` each attacker's row goes through it (encoded as that
    attacker, then decoded), so the server gets only what the channel can carry:
    at most k entries over top-k, signs over sign."""

    where: Where = "server_cohort"
    role: CohortRole = "attack"
    constraints: tuple[Constraint, ...] = (
        FirstCohortStage(
            "the simulated colluding attack", "it rewrites the attackers' updates before any gate"
        ),
    )

    def __init__(
        self,
        kind: CollusionKind,
        attackers: frozenset[int],
        z: float | None = None,
        epsilon: float = 0.5,
        codec: Codec | None = None,
        probability: float = 1.0,
    ) -> None:
        self.name = f"attack:{kind}"
        self.kind, self.attackers, self.z, self.epsilon = kind, attackers, z, epsilon
        self.probability = probability
        self.codec = codec if codec is not None and codec.lossy else None

    def apply(
        self, cohort: CohortUpdates, ctx: StageContext
    ) -> tuple[CohortUpdates, list[tuple[int, str]]]:
        seed, r = ctx.seed, ctx.round_idx
        bad = torch.tensor(
            [faulty(self.attackers, self.probability, seed, r, c) for c in cohort.client_ids],
            dtype=torch.bool,
        )
        if not bad.any() or bad.all():
            return cohort, []  # nothing to attack, or no honest update to learn from
        honest = cohort.updates[~bad]
        mean = honest.mean(dim=0)
        if self.kind == "alie":
            z = self.z if self.z is not None else alie_z(len(bad), int(bad.sum()))
            row = mean - z * honest.std(dim=0, correction=0)
        else:
            row = -self.epsilon * mean
        updates = cohort.updates.clone()
        updates[bad] = row
        if self.codec is not None:
            for i in bad.nonzero().flatten().tolist():
                where = CodecContext(ctx.seed, ctx.round_idx, cohort.client_ids[i])
                tensors, meta = self.codec.encode(row, where)
                updates[i] = self.codec.decode(tensors, meta, row.numel(), row.dtype, where)
        return (
            CohortUpdates(list(cohort.client_ids), updates, cohort.weights, cohort.reports),
            [],
        )
