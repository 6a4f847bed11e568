"""The drift schedule (``drift``): clients whose data changes across rounds.

``kind: label_map`` is a concept drift at round boundaries: rounds are cut into
phases of ``every`` rounds, and in round r every client sees its labels
through the map of phase floor(r / every), the maps cycling over ``groups``
label permutations (phase 0's the identity, the others derangements drawn
from the run seed; data/drift.py). The test set is read through the same map,
so a round's test accuracy is the accuracy on the distribution of that round.

``kind: label_mix`` moves the clients' label proportions instead: the classes
are dealt over ``groups`` groups (from the seed), phase p favours group
p mod groups, and each client's examples are redrawn each phase, as many as it
holds, with replacement, a favoured class ``strength`` times as likely as
another; the test set is redrawn the same way (the labels stay as they are).

This module checks the section's fields and how it fits the rest of a run;
it imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_ROUNDS
from fedforge.config.ranges import Most, Range
from fedforge.config.task import KINDS
from fedforge.core.errors import ConfigError

DriftKind = Literal["none", "label_map", "label_mix"]
MAX_DRIFT_MAPS = 10  # at most one map a class of MNIST


@dataclass(frozen=True)
class DriftConfig:
    """How the clients' data moves with the round (``kind: none``: it does not)."""

    kind: DriftKind = "none"
    # rounds a phase lasts: the map changes at rounds every, 2 every, ...
    every: Annotated[
        int, Range(">= 1", note="rounds a phase lasts"), Most(MAX_ROUNDS, "rounds")
    ] = 10
    # label_map: the maps the phases cycle over (phase p uses map p mod groups; map 0
    # the identity); label_mix: the groups of classes the phases favour in turn
    groups: Annotated[
        int,
        Range(">= 2", note="label maps or class groups the phases cycle over"),
        Most(MAX_DRIFT_MAPS, "label maps or class groups"),
    ] = 2
    # label_mix: how many times as likely a favoured class is drawn as another
    strength: Annotated[float, Range("[1, 1000]", note="1: no shift")] = 4.0

    @property
    def on(self) -> bool:
        """Whether the clients' data drifts at all."""
        return self.kind != "none"


def drift_fits(
    drift: DriftConfig,
    dataset: str,
    client_data: str,
    eval_clients: bool,
    loss_gap: bool,
    validation: float,
    client_gate: bool,
    weights: str,
    buffered: bool,
    proxy_tunes: bool,
    canary_every: int,
    cold_start: bool,
    upload_every: int,
) -> None:
    """A drift needs one class id a row, data the simulation holds, and nothing
    else that reads a client's labels outside its training (they would read
    them without the round's drift): each refusal one line naming the field."""
    if not drift.on:
        return
    rules: list[tuple[str, object, bool, str, str]] = [
        (
            "dataset",
            dataset,
            KINDS.get(dataset, "classification") != "classification",
            "its labels are not one class id a row; a label map permutes class ids",
            "a classification data set (mnist, synthetic)",
        ),
        (
            "deployment.client_data",
            client_data,
            client_data == "remote",
            "the clients bring their own data; the drift simulates their labels",
            "'partition'",
        ),
        (
            "evaluation.clients",
            eval_clients,
            eval_clients,
            "each client's held-out slice is scored without the round's drift",
            "false",
        ),
        (
            "diagnostics.loss_gap",
            loss_gap,
            loss_gap,
            "the global model's loss on the cohort's data is read without the round's drift",
            "false",
        ),
        (
            "evaluation.validation",
            validation,
            validation > 0,
            "the validation rows are scored without the round's drift",
            "0",
        ),
        (
            "robust.client_gate",
            client_gate,
            client_gate,
            "the client's gate scores its held-out rows without the round's drift",
            "false",
        ),
        (
            "aggregation.weights",
            weights,
            weights in ("quality", "class"),
            "the clients' reports read their labels without the round's drift",
            "'num_examples'",
        ),
        (
            "asynchronous.buffered",
            buffered,
            buffered,
            "an update trained in one phase may arrive in the next",
            "false",
        ),
        (
            "proxy.tune_epochs",
            proxy_tunes,
            proxy_tunes,
            "the server tunes the model on the proxy's labels without the round's drift",
            "0",
        ),
        (
            "deployment.canary_every",
            canary_every,
            canary_every > 0,
            "the clients score the candidate on their labels without the round's drift",
            "0",
        ),
        (
            "deployment.cold_start",
            cold_start,
            cold_start,
            "new clients score the model on their labels without the round's drift",
            "false",
        ),
        (
            "communication.upload_every",
            upload_every,
            upload_every > 1 and drift.every % upload_every != 0,
            f"an upload period would cross a phase boundary (drift.every = {drift.every}) "
            "and train in one phase the rounds of two",
            "a divisor of drift.every",
        ),
    ]
    for name, value, refused, why, fix in rules:
        if refused:
            raise ConfigError(
                f"{name} = {value!r} cannot run with drift.kind = {drift.kind!r}: {why}; use {fix}"
            )
