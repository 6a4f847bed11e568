"""Secure aggregation cost of the protocol alone (no training): server and client
time and bytes up per client for K clients x P parameters x dropout after the
masked-input phase, against a plain sum of the same float32 vectors.

    python benchmarks/secagg_cost.py [--quick]

The issue's headline (a whole MNIST CNN round with SecAgg over one without it)
needs the round integration, which is not done yet; this measures the protocol.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedforge.stages.secagg import FixedPoint, Simulated, modulus_bits, secure_sum


def one(k: int, p: int, drop: float, seed: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    xs = {c: rng.uniform(-1, 1, p) / np.sqrt(p) for c in range(k)}
    fp = FixedPoint(20, modulus_bits(1.0, k, 20))
    t = max(2, int(np.ceil(0.66 * k)))
    dropped = set(rng.choice(k, int(drop * k), replace=False).tolist())
    t0 = time.perf_counter()
    sim = Simulated(xs, 0, t, fp)
    res = secure_sum(list(range(k)), p, t, fp, sim, {"unmask": dropped})
    secure = time.perf_counter() - t0
    assert res.total is not None, res.reason
    t0 = time.perf_counter()
    _ = sum(xs[c].astype(np.float32) for c in range(k))
    plain = time.perf_counter() - t0
    return secure, plain, sim.bytes_up / k / (4 * p)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    grid = [(10, 10_000)] if args.quick else [(10, 100_000), (50, 100_000), (100, 100_000)]
    drops = [0.0, 0.1] if args.quick else [0.0, 0.1, 0.3]
    print(f"{'K':>4} {'P':>8} {'drop':>5} {'secagg s':>9} {'plain s':>9} {'bytes/float32':>14}")
    ratio = {}
    for k, p in grid:
        for d in drops:
            s, pl, b = one(k, p, d, 0)
            ratio[(k, p, d)] = b
            print(f"{k:>4} {p:>8} {d:>5.1f} {s:>9.3f} {pl:>9.5f} {b:>14.3f}")
    k, p = grid[-1]
    print(f"RESULT secagg_bytes_ratio_{k}c_drop10={ratio[(k, p, 0.1)]:.3f}")


if __name__ == "__main__":
    main()
