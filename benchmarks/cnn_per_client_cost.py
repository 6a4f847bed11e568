"""Where a CNN client's step at B = 10 loses to B = 100, by operator (one thread).

    python benchmarks/cnn_per_client_cost.py [--blocks 6]

The serial engine's CNN step as it runs (pooling first, fc1/fc2 stepping in
their backward: fused_sgd.py), profiled over one round of 2 clients (MNIST,
E = 1) in three variants, interleaved in blocks:
  b10          B = 10, what the default job runs;
  b100         B = 100, the same clients;
  b10_onednn   B = 10 with the fc layers' forward through oneDNN's inner
               product instead of ``addmm`` (alone 1.6x faster for fc1 at 10
               rows: does it help the step?).
Per sample, in microseconds of operator time under the profiler: the
convolutions (forward and backward), the fully connected layers (forward
products, and the input gradient and update products of their fused backward),
everything else (the profiler's own cost lands mostly here: it inflates small
operators, e.g. pooling's 1 MB zero fill, ~0.5 ms profiled, ~0.05 ms timed
alone); samples/s from the same round timed without the profiler.
Last line: RESULT with medians and paired ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import torch
from torch.profiler import profile

from engine_throughput import engine_runner
from fedforge import config as config_mod
from fedforge import fused_sgd
from fedforge.experiment import load_federated_data
from fedforge.server.sampling import sample_cohort

GROUPS = {
    "conv": ("aten::mkldnn_convolution", "aten::convolution_backward"),
    "fc_forward": ("aten::addmm", "mkldnn::_linear_pointwise"),
    "fc_backward": ("aten::addmm_",),
}


def onednn_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x W^T + b`` through oneDNN's inner product."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return out


def profiled(once: Callable[[], float], samples: int, onednn: bool) -> dict[str, float]:
    """Operator microseconds per sample by group, and samples/s, of one round."""
    product = fused_sgd.linear_product
    if onednn:
        fused_sgd.linear_product = onednn_product
    try:
        rate = once()  # timed without the profiler, which inflates small operators
        with profile() as prof:
            once()
    finally:
        fused_sgd.linear_product = product
    spent = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    out = {g: sum(spent.get(k, 0.0) for k in keys) / samples for g, keys in GROUPS.items()}
    out["other"] = sum(spent.values()) / samples - sum(out.values())
    out["samples_s"] = rate
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--blocks", type=int, default=6)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    runners = {}
    for batch in (10, 100):
        cfg = config_mod.Config(
            model="cnn", num_clients=100, client_fraction=0.02, local_epochs=1,
            batch_size=batch, target_accuracy=None, engine="serial", workers=1,
        )  # fmt: skip
        exp, once = engine_runner(cfg, load_federated_data(cfg))
        cohort = sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, 0)
        runners[batch] = (once, sum(exp.data.num_examples(c) for c in cohort))
    variants = {"b10": (10, False), "b100": (100, False), "b10_onednn": (10, True)}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for block in range(args.blocks + 1):  # block 0 warms up
        for name, (batch, onednn) in variants.items():
            figures = profiled(*runners[batch], onednn)
            if block:
                rows[name].append(figures)
                figures["fc"] = figures["fc_forward"] + figures["fc_backward"]
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in rows.items()}

    def paired(a: str, b: str, key: str) -> float:
        return statistics.median(x[key] / y[key] for x, y in zip(rows[a], rows[b], strict=True))

    heads = ("conv", "fc_fwd", "fc_bwd", "other")
    print(f"{'us/sample':12s} " + " ".join(f"{h:>7s}" for h in heads) + " samples/s")
    for name, m in med.items():
        print(
            f"{name:12s} {m['conv']:7.0f} {m['fc_forward']:7.0f} {m['fc_backward']:7.0f} "
            f"{m['other']:7.0f} {m['samples_s']:9.0f}"
        )
    print(
        f"RESULT fc_b10_vs_b100={paired('b10', 'b100', 'fc'):.2f} "
        f"conv_b10_vs_b100={paired('b10', 'b100', 'conv'):.2f} "
        f"other_b10_vs_b100={paired('b10', 'b100', 'other'):.2f} "
        f"onednn_fc_forward={paired('b10_onednn', 'b10', 'fc_forward'):.2f} "
        f"onednn_fc={paired('b10_onednn', 'b10', 'fc'):.2f} "
        f"onednn_samples_s={paired('b10_onednn', 'b10', 'samples_s'):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
