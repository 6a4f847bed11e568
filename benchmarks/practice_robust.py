"""Robust defaults against one hostile client: the update-norm bound and the
canary judge, on real MNIST in simulation (minutes on two cores).

``bound_attack_acc_drop``: the 2NN on 10 IID clients holding MNIST's first
6,000 training images (600 each; the 10,000 test images score), all of them
every round (C = 1, E = 1, B = 20, lr 0.1), 5 rounds; the honest run
against the same run (same seed) where one client sends 10^4 x its update
(``robust.attack: scaled``: a norm near 2 x 10^4 where honest ones are 1-4,
inside the absolute bound 100 x (||w|| + sqrt P) ~ 4.5 x 10^4 that was the
only default before). The figure is the final test accuracy lost, in points,
at the default config (target: within 1); ``old_bound_acc_drop`` is the same
attack with ``robust.max_norm_multiple: null`` (the absolute bound alone).

``canary_flips``: the honest run's model after each round is a candidate
against the version then served, and so is that model with Gaussian noise
(std 0.1 a weight: a worse candidate); each of the 10 clients evaluates both
versions on its own rows with the project's evaluation, as a deployment's
canary clients do; the judge (``transport/canary.py``, accuracy, max drop 0.01,
all 10 reports) decides from the honest reports, then from the same reports
with client 0 lying against that decision (accuracy 0 or 1, 10^12 examples).
A flip is a decision the liar changed (target 0); ``weighted_mean_flips`` is
what the example-weighted mean the judge used before would have let it flip.
The canary is simulated (the judge fed real evaluations in this process); the
real-process deployment of a liar is tests/test_deployment_canary_liar.py.

    FEDFORGE_DATA=/path/to/data OMP_NUM_THREADS=1 python benchmarks/practice_robust.py
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch

from _common import result_line
from fedforge.config import Config, EvaluationConfig, PartitionConfig, RobustConfig
from fedforge.core.rng import torch_generator
from fedforge.data.federated import FederatedData, load_federated_data
from fedforge.data.user import from_tensors
from fedforge.evaluation.evaluate import evaluate
from fedforge.report.progress import Progress
from fedforge.server.experiment import Experiment, build
from fedforge.server.loop import run
from fedforge.server.round import run_round
from fedforge.server.state import LoopState
from fedforge.transport.canary import CanaryJudge, CanaryPolicy

CLIENTS, ROUNDS, LIAR = 10, 5, 0
ATTACK = {"attack": "scaled", "attack_fraction": 0.1, "attack_scale": 1e4}


def _cfg(**robust: Any) -> Config:
    return Config(
        name="practice-robust", model="2nn", data_dir=os.environ.get("FEDFORGE_DATA"),
        num_clients=CLIENTS, partition=PartitionConfig(kind="iid"), client_fraction=1.0,
        local_epochs=1, batch_size=20, lr=0.1, rounds=ROUNDS, target_accuracy=None,
        seed=0, checkpoint_every=0, evaluation=EvaluationConfig(every=ROUNDS), engine="serial",
        robust=RobustConfig(**robust),
    )  # fmt: skip


def _data() -> FederatedData:
    """MNIST's first 600 x CLIENTS training images, 600 a client in order, and
    the whole test set."""
    full = load_federated_data(_cfg())
    n = 600 * CLIENTS
    parts = [list(range(k * 600, (k + 1) * 600)) for k in range(CLIENTS)]
    return from_tensors(
        full.train_x[:n], full.train_y[:n], full.test_x, full.test_y, parts, num_classes=10
    )


def _final_accuracy(cfg: Config, data: FederatedData) -> tuple[float, list[str]]:
    result = run(cfg, data=data, progress=False, store=False)
    acc = result.rounds[-1].test_accuracy
    assert acc is not None
    return 100.0 * acc, [why for _, _, why in result.rejected]


def bound_figures(data: FederatedData) -> dict[str, Any]:
    honest, _ = _final_accuracy(_cfg(), data)
    attacked, refused = _final_accuracy(_cfg(**ATTACK), data)
    old, _ = _final_accuracy(_cfg(max_norm_multiple=None, **ATTACK), data)
    first = refused[0] if refused else ""
    print(
        f"honest {honest:.2f}%  attacked (default) {attacked:.2f}%  attacked (absolute "
        f"bound alone) {old:.2f}%; refused {len(refused)}: {first}"
    )
    return {
        "honest_acc": honest,
        "attacked_acc": attacked,
        "bound_attack_acc_drop": honest - attacked,
        "old_bound_acc_drop": honest - old,
        "attacker_refused": len(refused),
    }


def _scores(exp: Experiment, params: torch.Tensor) -> list[tuple[float, int]]:
    """Each client's accuracy of ``params`` on its own rows, and their count."""
    out = []
    for c in range(CLIENTS):
        x, y = exp.data.client_data(c)
        ev = evaluate(exp.model, exp.spec, params, x, y, exp.cfg.evaluation.batch_size, exp.metrics)
        out.append((ev.accuracy, len(y)))
    return out


def _decide(
    cand: list[tuple[float, int]], serv: list[tuple[float, int]], lie: str | None
) -> tuple[str, str]:
    """(the judge's decision, the example-weighted mean's) from the reports, with
    the liar's replaced by the lie that pushes toward ``lie`` (None: honest)."""
    policy = CanaryPolicy(1.0, "accuracy", 0.01, CLIENTS)
    judge = CanaryJudge(policy, 2, 1)
    reports = []
    for c, ((a_cand, n), (a_serv, _)) in enumerate(zip(cand, serv, strict=True)):
        if c == LIAR and lie is not None:
            good = lie == "promote"
            a_cand, a_serv, n = (1.0, 0.0, 10**12) if good else (0.0, 1.0, 10**12)
        reports.append((a_cand, a_serv, n))
        assert judge.report(c, 2, {"accuracy": a_cand}, n) is None
        assert judge.report(c, 1, {"accuracy": a_serv}, n) is None
    total = sum(n for _, _, n in reports)
    drop = math.fsum((s - a) * n for a, s, n in reports) / total
    return judge.decide().kind, "promote" if drop <= 0.01 else "rollback"


def canary_figures(data: FederatedData) -> dict[str, Any]:
    exp = build(_cfg(), data)
    state = LoopState.fresh(exp)
    serving = state.params.clone()
    flips = weighted_flips = decisions = promoted = 0
    for r in range(ROUNDS):
        run_round(exp, state, r, Progress(ROUNDS, "canary", enabled=False))
        noise = torch.randn(
            state.params.shape, generator=torch_generator(0, "damaged", r), dtype=state.params.dtype
        )
        for candidate in (state.params.clone(), state.params + 0.1 * noise):
            cand, serv = _scores(exp, candidate), _scores(exp, serving)
            honest, honest_mean = _decide(cand, serv, None)
            against = "rollback" if honest == "promote" else "promote"
            lied, lied_mean = _decide(cand, serv, against)
            mean_against = "rollback" if honest_mean == "promote" else "promote"
            _, mean_lied = _decide(cand, serv, mean_against)
            flips += lied != honest
            weighted_flips += mean_lied != honest_mean
            decisions += 1
            promoted += honest == "promote"
            print(f"round {r + 1}: honest {honest}, with the liar {lied} (weighted mean: "
                  f"honest {honest_mean}, with the liar {mean_lied})")  # fmt: skip
            if honest == "promote":
                serving = candidate
    return {
        "canary_flips": flips,
        "weighted_mean_flips": weighted_flips,
        "canary_decisions": decisions,
        "canary_promoted": promoted,
    }


def measure() -> dict[str, Any]:
    """The figures of the module docstring, as a dict."""
    torch.manual_seed(0)
    t0 = time.perf_counter()
    data = _data()
    out = {**bound_figures(data), **canary_figures(data)}
    out["seconds"] = time.perf_counter() - t0
    return out


if __name__ == "__main__":
    figures = measure()
    print(result_line(figures))
