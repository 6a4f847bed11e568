"""The CNN's written-out step against autograd's, side by side (one thread).

    python benchmarks/cnn_step_ablation.py [--blocks 7] [--clients 2]

The serial engine trains the same clients (MNIST, 100 IID clients, E=1, B=10)
in four variants, interleaved in blocks, ratios paired within a block:
  autograd_fp32   the model through ``functional_call`` and autograd, then one
                  ``_foreach_add_`` step (client.local_sgd's general path),
  written_fp32    the step written out (cnn_step.py): what the CNN runs now,
  autograd_bf16, written_bf16   the same under ``precision: bf16`` (autocast
                  for the autograd path).
Both paths compute the same parameters (bit for bit here, tests/test_cnn_step.py).
Last line: RESULT with samples/s of each and the paired ratios.
(Until session 10 this script compared the pooling order and the fully
connected layers' step inside an autograd backward: commit f09c69d.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import torch

from engine_throughput import engine_runner
from fedforge import config as config_mod
from fedforge.client import cnn_step
from fedforge.data.federated import load_federated_data


def variant(once: Callable[[], float], written: bool) -> float:
    """Samples/s of one round's cohort, with or without the written-out step."""
    applies = cnn_step.applies
    if not written:
        cnn_step.applies = lambda *args: False  # type: ignore[assignment]
    try:
        return once()
    finally:
        cnn_step.applies = applies  # type: ignore[assignment]


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
    data = load_federated_data(cfg)
    runs = {
        p: engine_runner(config_mod.override(cfg, {"precision": p}), data)[1]
        for p in ("fp32", "bf16")
    }
    variants = {
        f"{path}_{precision}": (runs[precision], path == "written")
        for precision in ("fp32", "bf16")
        for path in ("autograd", "written")
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for once, written in variants.values():  # warm-up
        variant(once, written)
    for _ in range(args.blocks):
        for name, (once, written) in variants.items():
            rates[name].append(variant(once, written))

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    for name, r in rates.items():
        print(f"{name:<14} {statistics.median(r):8.0f} samples/s (median of {args.blocks})")
    print(
        "RESULT "
        + " ".join(f"{name}={statistics.median(r):.0f}" for name, r in rates.items())
        + f" written_vs_autograd_fp32={paired('written_fp32', 'autograd_fp32'):.3f}"
        + f" written_vs_autograd_bf16={paired('written_bf16', 'autograd_bf16'):.3f}"
        + f" bf16_vs_fp32_written={paired('written_bf16', 'written_fp32'):.3f}"
        + f" bf16_vs_fp32_autograd={paired('autograd_bf16', 'autograd_fp32'):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
