"""Config sections of evaluation: ``evaluation`` (when the global model is
scored on the test set, each client's held-out slice, client groups, the named
metrics) and within it the personalised evaluation, which lets every
algorithm's global model be adapted by a few local steps before each client's
held-out slice is scored (FedAvg + fine-tuning is FedAvg with it on); and the
drift diagnostics logged every round. Each section checks its own fields, with
errors naming the field; how they combine with the rest of the run is checked
in compat.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from fedforge.config.bounds import MAX_EXAMPLES, MAX_ROUNDS, MAX_STEPS
from fedforge.config.pipeline import MetricName, no_repeats
from fedforge.config.ranges import Most, Range


@dataclass(frozen=True)
class PersonalEvalConfig:
    """Personalised evaluation (evaluation/personal.py): every evaluation round each
    client takes ``steps`` SGD steps from the global model on its own training data,
    in minibatches of the run's ``batch_size``, then is scored on its held-out slice."""

    steps: Annotated[
        int,
        Range(">= 0", note="0 turns personalised evaluation off"),
        Most(MAX_STEPS, "local steps an evaluation"),
    ] = 0
    # null: perfedavg.alpha under perfedavg, else the run's lr
    lr: Annotated[float | None, Range("> 0", null="perfedavg.alpha under perfedavg, else lr")] = (
        None
    )


@dataclass(frozen=True)
class EvaluationConfig:
    """When and what the run evaluates (server/round.py, evaluation/)."""

    # rounds between evaluations of the global model on the test set (and the last round)
    every: Annotated[int, Range(">= 1"), Most(MAX_ROUNDS, "rounds")] = 1
    initial: bool = False  # also evaluate the initial model before round 1 (a baseline)
    clients: bool = False  # also evaluate on each client's held-out slice (clients.py)
    # clients: the fraction of each client's data held out
    holdout: Annotated[float, Range("(0, 1)")] = 0.2
    # clients: a CSV 'client_id,<attribute>,...' of client groups (data/tags.py)
    client_tags: str | None = None
    # clients: also score each client after a few local steps (personal.py)
    personal: PersonalEvalConfig = field(default_factory=PersonalEvalConfig)
    # figures beyond the task's score, computed on the test set at each evaluation
    # (fedforge.register_metric; built-in: accuracy, token_accuracy, mse)
    metrics: tuple[MetricName, ...] = ()
    # the fraction of the training data carved out as a validation split
    # (evaluation/validation.py): the target and rounds to target read its accuracy;
    # 0: none, the test set read throughout
    validation: Annotated[float, Range("[0, 1)")] = 0.0
    # per_client: that fraction of each client's examples; central: of the pooled set
    validation_split: Literal["per_client", "central"] = "per_client"
    # small batches stay in cache (the CNN evaluates faster at 250 than at 2,000)
    batch_size: Annotated[int, Range(">= 1"), Most(MAX_EXAMPLES, "examples a batch")] = 250

    def check(self) -> None:
        no_repeats("evaluation.metrics", self.metrics)


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
    low_cosine: Annotated[float, Range("[-1, 1]")] = 0.0
    # ... for this many rounds in a row
    low_cosine_rounds: Annotated[int, Range(">= 1"), Most(MAX_ROUNDS, "rounds")] = 3
