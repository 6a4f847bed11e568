"""Secure aggregation cost of the protocol alone (no training): client time (per
client, all phases), server time and bytes up per client (masked inputs packed
at k bits a word, key and share messages included) for K in {10, 50, 100}
clients x P in {100k, 1.66M} parameters x dropout {0, 10%, 30%} after the
masked-input phase, against a plain sum of the same float32 vectors.

    python benchmarks/secagg_cost.py [--quick]
    python benchmarks/secagg_cost.py --round [--clients 100 --model cnn --pairs 3]

``--round`` gives the issue's headline: the wall time of a whole MNIST round
(clients of 600 samples, E = 1, B = 10, local training included, 10% of the
cohort dropping after the masked-input phase) with secure aggregation over the
same round without it, measured interleaved (plain, secure, secure, plain, ...)
with the ratio paired per block. Both clip at 1.0 (communication.clip_norm): the
modulus needs a bound. The full figure is ``--clients 100 --model cnn``; a reduced
one is e.g. ``--clients 10 --model 2nn``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedforge.stages.secagg import FixedPoint, Simulated, modulus_bits, secure_sum


def one(k: int, p: int, drop: float, seed: int) -> tuple[float, float, float, float]:
    """(client seconds per client, server seconds, plain-sum seconds, bytes up per
    client over float32's) of one protocol run, ``drop`` of the clients dropping
    after the masked-input phase."""
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
    return sim.client_seconds / k, secure - sim.client_seconds, plain, sim.bytes_up / k / (4 * p)


def whole_round(clients: int, model: str, pairs: int, data_dir: str | None) -> None:
    """Paired wall times of one round with and without secure aggregation."""
    import torch

    from fedforge.config import from_dict
    from fedforge.experiment import build, load_federated_data
    from fedforge.report.progress import Progress
    from fedforge.server.round import run_round
    from fedforge.server.state import LoopState

    base = {
        "model": model,
        "num_clients": 100,
        "client_fraction": clients / 100,  # 100 clients of 600 MNIST samples
        "local_epochs": 1,
        "batch_size": 10,
        "rounds": 10_000,  # no evaluation inside the measured rounds
        "eval_every": 10_000,
        "target_accuracy": None,
        "data_dir": data_dir,
        "communication": {"clip_norm": 1.0},
    }
    secure = {"secagg": True, "secagg_drop_unmask": 0.1}
    plain_cfg = from_dict(base)
    data = load_federated_data(plain_cfg)
    exps = {
        "plain": build(plain_cfg, data),
        "secagg": build(from_dict({**base, "privacy": secure}), data),
    }
    states = {k: LoopState.fresh(e) for k, e in exps.items()}
    bar = Progress(1, "secagg", enabled=False)
    times: dict[str, list[float]] = {"plain": [], "secagg": []}
    bytes_up: dict[str, int] = {}
    for r in range(pairs + 1):  # the first pair warms up and is not counted
        for name in ("plain", "secagg") if r % 2 else ("secagg", "plain"):  # ABBA order
            t0 = time.perf_counter()
            record, _ = run_round(exps[name], states[name], r, bar)
            if r:
                times[name].append(time.perf_counter() - t0)
                bytes_up[name] = record.bytes_up
    ratios = [s / p for s, p in zip(times["secagg"], times["plain"], strict=True)]
    print(
        f"threads {torch.get_num_threads()}  {clients} clients  {model}  "
        "10% drop after the masked input"
    )
    print(f"{'pair':>4} {'plain s':>9} {'secagg s':>9} {'ratio':>7}")
    for i, (p, s) in enumerate(zip(times["plain"], times["secagg"], strict=True)):
        print(f"{i:>4} {p:>9.2f} {s:>9.2f} {s / p:>7.3f}")
    up_ratio = bytes_up["secagg"] / bytes_up["plain"]
    print(
        f"bytes up per round: plain {bytes_up['plain']}, secagg {bytes_up['secagg']} "
        f"({up_ratio:.3f}x)"
    )
    key = f"secagg_overhead_{clients}c_{'1m' if model == 'cnn' else model}_drop10"
    print(f"RESULT {key}={float(np.median(ratios)):.3f} secagg_bytes_up_ratio={up_ratio:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--round", action="store_true", help="whole rounds with and without SecAgg")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    if args.round:
        whole_round(args.clients, args.model, args.pairs, args.data_dir)
        return
    sizes = [10_000] if args.quick else [100_000, 1_663_370]
    grid = [(k, p) for p in sizes for k in ((10,) if args.quick else (10, 50, 100))]
    drops = [0.0, 0.1] if args.quick else [0.0, 0.1, 0.3]
    print(
        f"{'K':>4} {'P':>9} {'drop':>5} {'client s':>9} {'server s':>9} {'plain s':>8} "
        f"{'bytes/float32':>14}"
    )
    ratio = {}
    for k, p in grid:
        for d in drops:
            client, server, pl, b = one(k, p, d, 0)
            ratio[(k, p, d)] = b
            print(f"{k:>4} {p:>9} {d:>5.1f} {client:>9.3f} {server:>9.3f} {pl:>8.4f} {b:>14.3f}")
    k, p = grid[-1]
    print(f"RESULT secagg_bytes_ratio_{k}c_drop10={ratio[(k, p, 0.1)]:.3f}")


if __name__ == "__main__":
    main()
