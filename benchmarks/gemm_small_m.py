"""How fast this machine's matrix products are for the 2NN's first layer at the
row counts federated training gives them (one thread).

    python benchmarks/gemm_small_m.py [--reps 300]

One forward product and one fused weight step of fc1 (784 -> 200), as the
vectorised engine's perceptron path does them per client (engines/batched_mlp.py:
``X W^T`` and ``W.addmm_(G^T, X)``), at M = 10 rows (one client's minibatch,
B = 10) and at M = 50 and 100 (central training at K*B over one or two
processes). Multiply-adds per second of each; their ratio bounds what any
engine training clients at B = 10 on their own weights can reach against
central K*B with these kernels. Last line: RESULT.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def macs_per_second(rows: int, reps: int) -> float:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(200, 784, generator=gen)
    x = torch.randn(rows, 784, generator=gen)
    g = torch.randn(rows, 200, generator=gen) * 1e-3
    for _ in range(20):  # warm-up
        torch.mm(x, weight.t())
        weight.addmm_(g.t(), x, alpha=-1e-3)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(x, weight.t())
        weight.addmm_(g.t(), x, alpha=-1e-3)
    return 2 * rows * 784 * 200 * reps / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--blocks", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = (10, 50, 100)
    rates: dict[int, list[float]] = {m: [] for m in rows}
    for _ in range(args.blocks):  # interleaved: the machine's speed drifts
        for m in rows:
            rates[m].append(macs_per_second(m, args.reps))
    best = {m: max(r) for m, r in rates.items()}
    for m in rows:
        print(f"M = {m:>3}: {best[m] / 1e9:6.1f} GMAC/s (best of {args.blocks})")
    print(
        f"RESULT gmacs_m10={best[10] / 1e9:.1f} gmacs_m50={best[50] / 1e9:.1f} "
        f"gmacs_m100={best[100] / 1e9:.1f} m10_vs_m50={best[10] / best[50]:.2f} "
        f"m10_vs_m100={best[10] / best[100]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
