"""Config sections of evaluation beyond the global test accuracy: the
personalised evaluation, which lets every algorithm's global model be adapted
by a few local steps before each client's held-out slice is scored (FedAvg +
fine-tuning is FedAvg with it on), and the drift diagnostics logged every
round. Each section checks its own fields, with errors naming the field; how
they combine with the rest of the run is checked in compat.py."""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.core.errors import raise_first


@dataclass(frozen=True)
class PersonalEvalConfig:
    """Personalised evaluation (evaluation/personal.py): every evaluation round each
    client takes ``steps`` SGD steps from the global model on its own training data,
    in minibatches of the run's ``batch_size``, then is scored on its held-out slice."""

    steps: int = 0  # 0: off
    lr: float | None = None  # null: perfedavg.alpha under perfedavg, else the run's lr

    def check(self) -> None:
        raise_first(
            "personal_eval.",
            [
                (
                    "steps",
                    self.steps,
                    self.steps >= 0,
                    "must be an integer >= 0 (0 turns personalised evaluation off)",
                ),
                (
                    "lr",
                    self.lr,
                    self.lr is None or self.lr > 0.0,
                    "must be a number > 0, or null (perfedavg.alpha under perfedavg, else lr)",
                ),
            ],
        )


@dataclass(frozen=True)
class DiagnosticsConfig:
    """Drift diagnostics logged every round (server/diagnostics.py)."""

    updates: bool = True  # mean pairwise cosine and norms of the cohort's updates
    # the global model's loss on each cohort client's data: an extra no-grad pass
    # over the cohort's data every round, so off by default
    loss_gap: bool = False
    # warn once when the mean cosine stays below this ... (IID MNIST at E = 1,
    # B = 10 measures ~0.09: SGD noise in many dimensions; below 0 the cohort's
    # updates disagree on average)
    low_cosine: float = 0.0
    low_cosine_rounds: int = 3  # ... for this many rounds in a row

    def check(self) -> None:
        raise_first(
            "diagnostics.",
            [
                (
                    "low_cosine",
                    self.low_cosine,
                    -1.0 <= self.low_cosine <= 1.0,
                    "must be in [-1, 1]",
                ),
                (
                    "low_cosine_rounds",
                    self.low_cosine_rounds,
                    self.low_cosine_rounds >= 1,
                    "must be an integer >= 1",
                ),
            ],
        )
