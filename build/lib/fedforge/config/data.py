"""Config sections of the data: how the training set is split over clients
(with FedBN's feature shift and label noise) and the Synthetic(alpha, beta)
data set of FedProx. Each section checks its own fields, with errors naming
the field; how they combine with the rest of the run is checked in compat.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


@dataclass(frozen=True)
class PartitionConfig:
    """How the training set is split over clients."""

    kind: PartitionKind = "iid"
    shards_per_client: int = 2  # shards: McMahan's 200 shards of 300 = 2 per client
    alpha: float = 0.5  # dirichlet, hsu: label-skew concentration (> 0)
    sigma: float = 1.0  # quantity: lognormal sigma of client sizes (>= 0)
    min_size: int = 1  # dirichlet/quantity: smallest client allowed
    # FedBN's feature shift: domains dealt over the clients, one each; () = off
    feature_shift: tuple[FeatureDomain, ...] = ()
    label_noise: float = 0.0  # fraction of clients whose labels are noisy
    label_noise_rule: LabelNoiseRule = "symmetric"  # symmetric: another class; pair: y + 1
    label_noise_rate: float = 1.0  # of a noisy client's examples, the fraction relabelled

    def check(self) -> None:
        shift = self.feature_shift
        raise_first(
            "partition.",
            [
                (
                    "shards_per_client",
                    self.shards_per_client,
                    self.shards_per_client >= 1,
                    "must be an integer >= 1",
                ),
                ("alpha", self.alpha, self.alpha > 0.0, "must be > 0"),
                ("sigma", self.sigma, self.sigma >= 0.0, "must be >= 0"),
                ("min_size", self.min_size, self.min_size >= 1, "must be an integer >= 1"),
                (
                    "feature_shift",
                    list(shift),
                    len(set(shift)) == len(shift),
                    "must name each domain once (domains are dealt over the clients in turn)",
                ),
                (
                    "label_noise",
                    self.label_noise,
                    0.0 <= self.label_noise <= 1.0,
                    "must be in [0, 1] (the fraction of clients with noisy labels)",
                ),
                (
                    "label_noise_rate",
                    self.label_noise_rate,
                    0.0 < self.label_noise_rate <= 1.0,
                    "must be in (0, 1] (the fraction of a noisy client's labels that are wrong)",
                ),
            ],
        )


@dataclass(frozen=True)
class SyntheticConfig:
    """Synthetic(alpha, beta) of FedProx (dataset: synthetic; num_clients users)."""

    alpha: float = 1.0  # std of the per-client model means (model heterogeneity)
    beta: float = 1.0  # std of the per-client feature means (data heterogeneity)
    iid: bool = False  # Synthetic-IID: one W, b for all, features N(0, Sigma)
    test_fraction: float = 0.1  # of each client's samples held out (the official 90/10)

    def check(self) -> None:
        raise_first(
            "synthetic.",
            [
                ("alpha", self.alpha, self.alpha >= 0.0, "must be >= 0"),
                ("beta", self.beta, self.beta >= 0.0, "must be >= 0"),
                (
                    "test_fraction",
                    self.test_fraction,
                    0.0 < self.test_fraction < 1.0,
                    "must be in (0, 1)",
                ),
            ],
        )
