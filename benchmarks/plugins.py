"""What a plugin costs: FedProx registered from examples/my_fedprox.py (the
tutorial's file, loaded as ``--plugin`` loads it) against the built-in
``fedprox`` on the same config, seconds per round, and the line count of
every examples/*.py (the public API is judged by them).

MNIST, McMahan et al. 2017's IID configs (configs/2nn_iid_e1_b10.yaml,
configs/cnn_iid_e1_b10.yaml: 100 clients, C = 0.1, E = 1, B = 10) with mu =
0.01, 5 rounds a run, in one process on one torch thread (``workers: 1``,
``threads: 1``): the 2NN on the vectorised engine (both arms take the fused
perceptron step, the plugin through its declared ``LinearTerm``), the CNN on
the serial one (the hook called at every step) with C = 0.05 (5 clients a
round, ``--cnn-fraction``) so that the whole takes about 5 minutes on two
shared cores. No evaluation but the closing one, on a test set of one image.

The two arms run alternately in this one process (A B, then B A, ...), after
one discarded warm-up run each. A round hook takes each round's seconds from
its start to its end: the process's CPU seconds (on one thread, the round's
work, which other jobs on the machine do not inflate) and wall seconds. The
figure is the ratio of the arms' median CPU seconds per round, over every
timed round; the wall ratio is printed beside it. The arms must end with the
same model (the same computation): checked.

    FEDFORGE_DATA=/work/shared/data python benchmarks/plugins.py

Last line: ``RESULT plugin_vs_builtin_2nn=X plugin_vs_builtin_cnn=Y example_lines_max=N``
(target: X, Y <= 1.05: the registry adds no work to a round).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import fedforge
from fedforge import config as config_mod
from fedforge.core.registry import load_plugin
from fedforge.data.federated import FederatedData, load_federated_data
from fedforge.server.loop import run

ROOT = Path(__file__).resolve().parent.parent
MU = 0.01
ENGINES = {"2nn": "vectorized", "cnn": "serial"}
ARMS: dict[str, dict[str, Any]] = {
    "builtin": {"algorithm": "fedprox", "fedprox": {"mu": MU}},
    "plugin": {"algorithm": "my_fedprox", "plugin_options": {"my_fedprox": {"mu": MU}}},
}


class RoundClock(fedforge.RoundHook):
    """CPU and wall seconds of each round, from its start to its end (observes only)."""

    name = "plugins_benchmark_clock"

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self._at = (0.0, 0.0)

    def round_start(self, info: fedforge.RoundInfo) -> None:
        self._at = (time.process_time(), time.perf_counter())

    def round_end(self, info: fedforge.RoundInfo, end: fedforge.RoundEnd) -> None:
        self.cpu.append(time.process_time() - self._at[0])
        self.wall.append(time.perf_counter() - self._at[1])


def one_run(cfg: config_mod.Config, data: FederatedData, clock: RoundClock) -> torch.Tensor:
    """One run of ``cfg`` (no run store) timed by ``clock``; its final model."""
    return run(cfg, data=data, store=False, hooks=[clock]).params


def timed_arms(
    base: config_mod.Config, arms: dict[str, dict[str, Any]], repeats: int, label: str
) -> tuple[dict[str, RoundClock], dict[str, torch.Tensor]]:
    """Each arm (``base`` with its fields) run ``repeats`` times after one uncounted
    warm-up, the arms' order reversed every other repeat so that drift in the
    machine's speed falls on both alike; a one-example test set keeps evaluation
    out of the timing. Returns each arm's clock and its final model."""
    full = load_federated_data(base)
    data = dataclasses.replace(full, test_x=full.test_x[:1], test_y=full.test_y[:1])
    cfgs = {arm: config_mod.override(base, extra) for arm, extra in arms.items()}
    clocks = {arm: RoundClock() for arm in arms}
    finals: dict[str, torch.Tensor] = {}
    for arm in arms:  # warm-up, not counted
        one_run(cfgs[arm], data, RoundClock())
    for i in range(repeats):
        for arm in arms if i % 2 == 0 else reversed(arms):
            finals[arm] = one_run(cfgs[arm], data, clocks[arm])
            cpu = statistics.median(clocks[arm].cpu[-base.rounds :])
            wall = statistics.median(clocks[arm].wall[-base.rounds :])
            print(
                f"{label} repeat {i} {arm:8s} cpu {cpu:.4f} wall {wall:.4f} s/round "
                "(median of the run)",
                flush=True,
            )
    return clocks, finals


def compare(model: str, args: argparse.Namespace) -> float:
    """The plugin's median CPU seconds per round over the built-in's, for ``model``."""
    fields: dict[str, Any] = {
        "rounds": args.rounds,
        "engine": ENGINES[model],
        "workers": 1,
        "threads": 1,
        "evaluation": {"every": 10**6},
        "target_accuracy": None,
        "checkpoint_every": 0,
    }
    if model == "cnn":
        fields["client_fraction"] = args.cnn_fraction
    if args.data_dir:
        fields["data_dir"] = args.data_dir
    base = config_mod.override(
        config_mod.load(ROOT / "configs" / f"{model}_iid_e1_b10.yaml"), fields
    )
    clocks, finals = timed_arms(base, ARMS, args.repeats, model)
    same = torch.equal(finals["plugin"], finals["builtin"])
    cpu = {arm: statistics.median(c.cpu) for arm, c in clocks.items()}
    wall = {arm: statistics.median(c.wall) for arm, c in clocks.items()}
    print(
        f"{model} ({ENGINES[model]}), median s/round over {len(clocks['plugin'].cpu)} rounds: "
        f"cpu built-in {cpu['builtin']:.4f} plugin {cpu['plugin']:.4f} "
        f"(x{cpu['plugin'] / cpu['builtin']:.3f}); wall built-in {wall['builtin']:.4f} "
        f"plugin {wall['plugin']:.4f} (x{wall['plugin'] / wall['builtin']:.3f}); "
        f"same final model: {same}",
        flush=True,
    )
    if not same:
        raise SystemExit(f"{model}: the plugin's model differs from the built-in's")
    return cpu["plugin"] / cpu["builtin"]


def example_lines() -> dict[str, int]:
    return {
        p.name: len(p.read_text().splitlines()) for p in sorted((ROOT / "examples").glob("*.py"))
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=4, help="timed runs per arm and model")
    p.add_argument("--models", default="2nn,cnn")
    p.add_argument("--cnn-fraction", type=float, default=0.05, help="the CNN's C")
    p.add_argument("--data-dir")
    args = p.parse_args(argv)
    os.environ.setdefault("FEDFORGE_PROBE", "off")  # the engine is the config's, not a probe's
    load_plugin(str(ROOT / "examples" / "my_fedprox.py"))
    print(f"mu = {MU}, {args.rounds} rounds a run, one torch thread, CNN C = {args.cnn_fraction}")
    ratios = {m: compare(m, args) for m in args.models.split(",")}
    lines = example_lines()
    for name, count in lines.items():
        print(f"{name:24s} {count:4d} lines")
    figures = " ".join(f"plugin_vs_builtin_{m}={r:.3f}" for m, r in ratios.items())
    print(f"RESULT {figures} example_lines_max={max(lines.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
