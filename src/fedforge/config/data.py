"""Config sections of the data: how the training set is split over clients
(with FedBN's feature shift and label noise) and the Synthetic(alpha, beta)
data set of FedProx. Each section checks its own fields, with errors naming
the field; how they combine with the rest of the run is checked in compat.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_EXAMPLES, MAX_STEPS
from fedforge.config.ranges import Most, Range
from fedforge.core.errors import raise_first

Dataset = Literal["mnist", "synthetic", "shakespeare", "regression"]
# how the loaded features are scaled (data/mnist.py): "standard" is the data set's
# own preprocessing (MNIST: (p - 0.1307) / 0.3081 of the pixels p = x / 255;
# Synthetic: the features as generated), "unit" MNIST's pixels x / 255 in [0, 1],
# "raw" the values as stored (MNIST: 0..255 as floats; Synthetic: as generated)
InputScaling = Literal["standard", "unit", "raw"]
# the scalings each data set has: a data set without an entry has "standard" only
SCALINGS: dict[str, tuple[str, ...]] = {
    "mnist": ("standard", "unit", "raw"),
    "synthetic": ("standard", "raw"),
}
# natural: the clients the data set comes with (Shakespeare's speaking roles)
PartitionKind = Literal["iid", "shards", "dirichlet", "hsu", "quantity", "natural"]
# feature-shift domains of data/shift.py and label-noise rules of data/noise.py
FeatureDomain = Literal["none", "rotation", "invert", "contrast", "blur", "noise", "scale"]
LabelNoiseRule = Literal["symmetric", "pair"]
MAX_LABEL_MAPS = 10  # concept shift: at most one map a class of MNIST


@dataclass(frozen=True)
class PartitionConfig:
    """How the training set is split over clients."""

    kind: PartitionKind = "iid"
    # shards: McMahan's 200 shards of 300 = 2 per client
    shards_per_client: Annotated[int, Range(">= 1"), Most(MAX_STEPS, "shards a client")] = 2
    alpha: Annotated[float, Range("> 0")] = 0.5  # dirichlet, hsu: label-skew concentration
    sigma: Annotated[float, Range(">= 0")] = 1.0  # quantity: lognormal sigma of client sizes
    min_size: Annotated[int, Range(">= 1"), Most(MAX_EXAMPLES, "examples a client")] = (
        1  # dirichlet/quantity: smallest client allowed
    )
    # FedBN's feature shift: domains dealt over the clients, one each; () = off
    feature_shift: tuple[FeatureDomain, ...] = ()
    # fraction of clients whose labels are noisy
    label_noise: Annotated[
        float, Range("[0, 1]", note="the fraction of clients with noisy labels")
    ] = 0.0
    # concept shift (data/concept.py): clients in this many groups, each seeing the
    # labels through its own permutation; 0 = off
    concept_shift: Annotated[
        int,
        Range(">= 0", note="0: off; else the number of label maps, 2 or more"),
        Most(MAX_LABEL_MAPS, "label maps"),
    ] = 0
    label_noise_rule: LabelNoiseRule = "symmetric"  # symmetric: another class; pair: y + 1
    # of a noisy client's examples, the fraction relabelled
    label_noise_rate: Annotated[
        float, Range("(0, 1]", note="the fraction of a noisy client's labels that are wrong")
    ] = 1.0

    def check(self) -> None:
        shift = self.feature_shift
        raise_first(
            "partition.",
            [
                (
                    "feature_shift",
                    list(shift),
                    len(set(shift)) == len(shift),
                    "must name each domain once (domains are dealt over the clients in turn)",
                ),
                (
                    "concept_shift",
                    self.concept_shift,
                    self.concept_shift != 1,
                    f"must be 0 (off) or 2..{MAX_LABEL_MAPS} label maps (one map is no shift)",
                ),
            ],
        )


@dataclass(frozen=True)
class SyntheticConfig:
    """Synthetic(alpha, beta) of FedProx (dataset: synthetic; num_clients users)."""

    # std of the per-client model means (model heterogeneity)
    alpha: Annotated[float, Range(">= 0")] = 1.0
    # std of the per-client feature means (data heterogeneity)
    beta: Annotated[float, Range(">= 0")] = 1.0
    iid: bool = False  # Synthetic-IID: one W, b for all, features N(0, Sigma)
    # of each client's samples held out (the official 90/10)
    test_fraction: Annotated[float, Range("(0, 1)")] = 0.1
