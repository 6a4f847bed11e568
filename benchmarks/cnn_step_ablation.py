"""What each change to the CNN's local step buys, side by side (one thread).

    python benchmarks/cnn_step_ablation.py [--blocks 7] [--clients 2]

The serial engine trains the same clients (MNIST, 100 IID clients, E=1, B=10)
in three variants, interleaved in blocks, ratios paired within a block:
  paper_order   ReLU then pooling, the optimizer's step after the backward
                (fedforge before session 6),
  pool_first    pooling before the ReLU (models/mnist.py; same numbers),
  fused         also the fully connected layers' step inside their backward
                (fused_sgd.py): what runs now.
Last line: RESULT with samples/s of each and the three paired ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import torch
from torch import nn

from engine_throughput import engine_runner
from fedforge import config as config_mod
from fedforge import fused_sgd
from fedforge.experiment import load_federated_data
from fedforge.models.mnist import MnistCNN


def paper_order(self: MnistCNN, x: torch.Tensor) -> torch.Tensor:
    """McMahan's CNN as written: ReLU, then 2x2 max pooling."""
    x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
    x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
    out: torch.Tensor = self.fc2(torch.relu(self.fc1(x.flatten(start_dim=1))))
    return out


def variant(once: Callable[[], float], pool_first: bool, fused: bool) -> float:
    """Samples/s of one round's cohort with the two changes switched as asked."""
    forward, layers = MnistCNN.forward, dict(fused_sgd.FUSED_LAYERS)
    if not pool_first:
        MnistCNN.forward = paper_order  # type: ignore[method-assign]
    if not fused:
        fused_sgd.FUSED_LAYERS.clear()
    try:
        return once()
    finally:
        MnistCNN.forward = forward  # type: ignore[method-assign]
        fused_sgd.FUSED_LAYERS.update(layers)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--clients", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = config_mod.Config(
        model="cnn", num_clients=100, client_fraction=args.clients / 100, local_epochs=1,
        batch_size=10, target_accuracy=None, engine="serial", workers=1,
    )  # fmt: skip
    _exp, once = engine_runner(cfg, load_federated_data(cfg))
    variants = {"paper_order": (False, False), "pool_first": (True, False), "fused": (True, True)}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for switches in variants.values():  # warm-up
        variant(once, *switches)
    for _ in range(args.blocks):
        for name, switches in variants.items():
            rates[name].append(variant(once, *switches))

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    for name, r in rates.items():
        print(f"{name:<12} {statistics.median(r):8.0f} samples/s (median of {args.blocks})")
    print(
        "RESULT "
        + " ".join(f"{name}={statistics.median(r):.0f}" for name, r in rates.items())
        + f" pool_first_vs_paper={paired('pool_first', 'paper_order'):.3f}"
        + f" fused_vs_pool_first={paired('fused', 'pool_first'):.3f}"
        + f" fused_vs_paper={paired('fused', 'paper_order'):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
