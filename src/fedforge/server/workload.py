"""The lines a run starts with (:func:`say_start`), among them the one it
prints when the local training it asks for, estimated before it starts, passes
a day on this project's machines (a typo such as ``local_epochs: 1000000000``
otherwise runs for ever without a word).

The estimate counts the examples that local training processes over the rounds
still to run: each round a cohort of m = max(1, C K) of the K clients (each
client with probability C under Poisson sampling) goes over its data E times,
so m / K of all clients' examples, E times, in expectation over the cohort draw.
FedSGD's one full-batch step counts as one epoch, Per-FedAvg's meta-steps as
three batches each (D, D' and D''); stragglers' shorter work and an early stop
at the target are not counted.

Every other loop a field multiplies is counted too, each at the fastest speed
it could go: the aggregator's passes over the cohort's updates
(``robust.centred_clip_iterations``, ``robust.geomed_max_iter``: m updates of P
values each pass, at :data:`VALUES_PER_SECOND`) and personalised evaluation's
local steps (``evaluation.personal.steps`` batches for every client, each evaluation).
The line names the loop that takes longest.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from fedforge.config import Config
from fedforge.selection.sampling import cohort_size
from fedforge.server.experiment import Experiment
from fedforge.server.registry import weight_rule

# Training examples a second for each built-in model on this project's 2-core CPU
# machines: the fastest engine measured for the model in docs/changelog.md (2 workers:
# 2NN ~30,000, CNN ~1,200), rounded up, so that the estimate errs short and the
# line appears only for runs that take longer even at the best speed seen here.
# The logistic regression and a registered model are not measured: the first is
# put at 10x the 2NN, the second (of unknown cost) at the 2NN's speed.
EXAMPLES_PER_SECOND = {"logreg": 300_000, "2nn": 30_000, "cnn": 1_500, "cnn_bn": 1_500}
UNKNOWN_MODEL_EXAMPLES_PER_SECOND = 30_000
DAY_SECONDS = 86_400
VALUES_PER_SECOND = 1e9  # an aggregator pass over updates: a few flops a value, errs short


def examples_to_train(
    cfg: Config, sizes: Sequence[int] | np.ndarray, first_round: int = 0
) -> float:
    """Expected examples processed by local training in rounds ``first_round`` ..
    ``cfg.rounds - 1`` (a float: 10^9 epochs make numbers past any int64 care)."""
    rounds = max(0, cfg.rounds - first_round)
    clients = len(sizes)
    if rounds == 0 or clients == 0:
        return 0.0
    if cfg.privacy.sampling == "poisson":
        share = cfg.client_fraction
    else:
        share = cohort_size(clients, cfg.client_fraction) / clients
    if cfg.algorithm == "perfedavg":  # meta-steps of three batches, not epochs
        each = [min(int(n), cfg.batch_size or int(n)) * 3 * cfg.perfedavg.steps for n in sizes]
        return float(rounds) * share * float(sum(each))
    return float(rounds) * share * float(sum(int(n) for n in sizes)) * float(cfg.local_epochs)


def aggregator_passes(cfg: Config) -> tuple[str, int] | None:
    """The field that sets the aggregator's passes over the cohort's updates, and
    its value; None for a one-pass aggregator."""
    r = cfg.robust
    if r.aggregator == "centred_clip":
        return "robust.centred_clip_iterations", r.centred_clip_iterations
    if r.aggregator == "geometric_median":
        return "robust.geomed_max_iter", r.geomed_max_iter
    return None


def estimated_seconds(
    cfg: Config, sizes: Sequence[int] | np.ndarray, first_round: int = 0
) -> float:
    rate = EXAMPLES_PER_SECOND.get(cfg.model, UNKNOWN_MODEL_EXAMPLES_PER_SECOND)
    return examples_to_train(cfg, sizes, first_round) / rate


def _span(seconds: float) -> str:
    days = seconds / DAY_SECONDS
    return f"{days:,.1f} days" if days < 3650 else f"{days / 365.25:.3g} years"


def _loops(
    cfg: Config, sizes: Sequence[int] | np.ndarray, params: int, first_round: int
) -> list[tuple[float, str]]:
    """The seconds of each loop besides local training, with its line."""
    rounds = max(0, cfg.rounds - first_round)
    clients = len(sizes)
    out: list[tuple[float, str]] = []
    passes = aggregator_passes(cfg)
    if passes is not None and clients and params:
        field, count = passes
        uploads = -(-rounds // cfg.communication.upload_every)
        values = float(uploads) * cohort_size(clients, cfg.client_fraction) * params * count
        seconds = values / VALUES_PER_SECOND
        out.append((seconds, (
            f"this run's aggregator may make {values:.3g} passes over update values "
            f"({uploads} upload rounds x {field} {count} x the cohort's {params:,}-value "
            f"updates): more than {_span(seconds)} at {VALUES_PER_SECOND:.0e} values/s; "
            f"lower {field} or rounds to shorten it"
        )))  # fmt: skip
    steps = cfg.evaluation.personal.steps
    if steps and cfg.evaluation.clients:
        evals = -(-rounds // cfg.evaluation.every)
        examples = float(evals) * steps * sum(min(int(n), cfg.batch_size or int(n)) for n in sizes)
        rate = EXAMPLES_PER_SECOND.get(cfg.model, UNKNOWN_MODEL_EXAMPLES_PER_SECOND)
        seconds = examples / rate
        out.append((seconds, (
            f"this run's personalised evaluation may train on {examples:.3g} examples "
            f"({evals} evaluations x evaluation.personal.steps {steps} x every client's batch): "
            f"more than {_span(seconds)} at {rate:,} examples/s; lower evaluation.personal.steps "
            "or raise evaluation.every to shorten it"
        )))  # fmt: skip
    return out


def workload_warning(
    cfg: Config, sizes: Sequence[int] | np.ndarray, first_round: int = 0, params: int = 0
) -> str | None:
    """One line when the rounds to run would take more than a day at the speeds
    above (``params``: the model's parameter count, for the aggregator's
    passes); None otherwise. The line is of the loop that takes longest."""
    seconds = estimated_seconds(cfg, sizes, first_round)
    loops = _loops(cfg, sizes, params, first_round)
    if seconds + sum(s for s, _ in loops) <= DAY_SECONDS:
        return None
    longest = max(loops, default=(0.0, ""))
    if longest[0] > seconds:
        return longest[1]
    rate = EXAMPLES_PER_SECOND.get(cfg.model, UNKNOWN_MODEL_EXAMPLES_PER_SECOND)
    span = _span(max(seconds, DAY_SECONDS * 1.05))
    return (
        f"this run may train on {examples_to_train(cfg, sizes, first_round):.3g} examples "
        f"({cfg.rounds - first_round} rounds x local_epochs {cfg.local_epochs} x the "
        f"cohort's data): more than {span} at {rate:,} examples/s, the fastest seen for "
        f"'{cfg.model}' on this machine; lower rounds, local_epochs or client_fraction "
        "to shorten it (target_accuracy may stop it sooner)"
    )


def say_start(exp: Experiment, first_round: int, progress: bool) -> None:
    """The run's first lines. With the progress bar, on stdout: the torch threads
    of its processes, the device when it is not the CPU, and the weight rule in
    force. On stderr, with or without it: ``engine: auto``'s probe, what the run
    does differently from its config (an engine or worker count that cannot run,
    bf16 emulated) and whether the rounds to run would train for more than a day."""
    if progress and exp.threads is not None:
        print(exp.threads.describe(), flush=True)
    if progress and exp.device.type != "cpu":
        print(f"device: {exp.device} (local training and evaluation)", flush=True)
    if progress:
        print(f"weights: {weight_rule(exp)}", flush=True)
    if exp.probe_line:
        print(f"fedforge: {exp.probe_line}", file=sys.stderr, flush=True)
    if exp.note:
        print(f"fedforge: {exp.note}", file=sys.stderr, flush=True)
    line = workload_warning(exp.cfg, exp.client_sizes(), first_round, exp.spec.size)
    if line is not None:
        print(f"fedforge: {line}", file=sys.stderr, flush=True)
