"""Secure aggregation cost of the protocol alone (no training): client time (per
client, all phases), server time and bytes up per client (masked inputs packed
at k bits a word, key and share messages included) for K in {10, 50, 100}
clients x P in {100k, 1.66M} parameters x dropout {0, 10%, 30%} after the
masked-input phase, against a plain sum of the same float32 vectors.
``--neighbours k`` runs SecAgg+ (Bell et al. 2020: masks and shares among k
neighbours of a random Harary graph) beside SecAgg at every point, interleaved,
with SecAgg+ over SecAgg per point; a round whose dropouts leave a neighbourhood
below t ends and is shown as such.

    python benchmarks/secagg_cost.py [--quick] [--neighbours 14]
    python benchmarks/secagg_cost.py --round [--clients 100 --model cnn --pairs 3]

``--round`` gives the issue's headline: the wall time of a whole MNIST round
(clients of 600 samples, E = 1, B = 10, local training included, 10% of the
cohort dropping after the masked-input phase) with secure aggregation over the
same round without it, measured interleaved (plain, secure, secure, plain, ...)
with the ratio paired per block. Both clip at 1.0 (communication.clip_norm): the
modulus needs a bound. The full figure is ``--clients 100 --model cnn``; a reduced
one is e.g. ``--clients 10 --model 2nn``. ``--neighbours k`` adds SecAgg+ as a
third run of each block (ABC, CBA, ...) and its ratios to the plain round and to
SecAgg.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedforge.privacy.secagg_graph import random_harary
from fedforge.privacy.secagg_masks import FixedPoint, modulus_bits
from fedforge.privacy.secagg_server import Simulated, secure_sum

Cost = tuple[float, float, float, float]  # client s a client, server s, plain s, bytes/float32


def one(k: int, p: int, drop: float, seed: int, neighbours: int | None = None) -> Cost | None:
    """(client seconds per client, server seconds, plain-sum seconds, bytes up per
    client over float32's) of one protocol run, ``drop`` of the clients dropping
    after the masked-input phase; SecAgg+ with ``neighbours`` (None: SecAgg).
    None when a SecAgg+ neighbourhood kept fewer than t and the round ended."""
    rng = np.random.default_rng(seed)
    xs = {c: rng.uniform(-1, 1, p) / np.sqrt(p) for c in range(k)}
    fp = FixedPoint(20, modulus_bits(1.0, k, 20))
    t = max(2, int(np.ceil(0.66 * k)))
    dropped = set(rng.choice(k, int(drop * k), replace=False).tolist())
    graph = random_harary(range(k), neighbours, seed, 0, 0.66) if neighbours else None
    t0 = time.perf_counter()
    sim = Simulated(xs, 0, t, fp, graph)
    res = secure_sum(list(range(k)), p, t, fp, sim, {"unmask": dropped}, graph)
    secure = time.perf_counter() - t0
    if res.total is None:
        assert graph is not None, res.reason  # SecAgg's t = 0.66 K holds at these drops
        return None
    t0 = time.perf_counter()
    _ = sum(xs[c].astype(np.float32) for c in range(k))
    plain = time.perf_counter() - t0
    return sim.client_seconds / k, secure - sim.client_seconds, plain, sim.bytes_up / k / (4 * p)


def protocol_grid(quick: bool, neighbours: int | None) -> None:
    """The protocol alone over the grid; SecAgg+ beside SecAgg with ``neighbours``."""
    sizes = [10_000] if quick else [100_000, 1_663_370]
    grid = [(k, p) for p in sizes for k in ((10,) if quick else (10, 50, 100))]
    drops = [0.0, 0.1] if quick else [0.0, 0.1, 0.3]
    plus = f"secagg+{neighbours}"
    print(
        f"{'K':>4} {'P':>9} {'drop':>5} {'protocol':>10} {'client s':>9} {'server s':>9} "
        f"{'plain s':>8} {'bytes/float32':>14}"
        + ("  (SecAgg+ / SecAgg: client server bytes)" if neighbours else "")
    )
    costs: dict[tuple[int, int, float, str], Cost | None] = {}
    for i, (k, p, d) in enumerate((k, p, d) for k, p in grid for d in drops):
        runs = [("secagg", None), (plus, neighbours)] if neighbours else [("secagg", None)]
        for name, nb in runs if i % 2 == 0 else runs[::-1]:  # interleaved: AB BA ...
            costs[(k, p, d, name)] = one(k, p, d, 0, nb)
        for name, _ in runs:
            cost, base = costs[(k, p, d, name)], costs[(k, p, d, "secagg")]
            if cost is None:
                print(f"{k:>4} {p:>9} {d:>5.1f} {name:>10}  ended: a neighbourhood below t")
                continue
            paired = (
                ""
                if name == "secagg" or base is None
                else "  " + " ".join(f"{cost[j] / base[j]:.3f}" for j in (0, 1, 3))
            )
            c, s, pl, b = cost
            row = f"{c:>9.3f} {s:>9.3f} {pl:>8.4f} {b:>14.3f}"
            print(f"{k:>4} {p:>9} {d:>5.1f} {name:>10} {row}{paired}")
    k, p = grid[-1]
    base = costs[(k, p, 0.1, "secagg")]
    assert base is not None
    result = f"RESULT secagg_bytes_ratio_{k}c_drop10={base[3]:.3f}"
    got = costs.get((k, p, 0.1, plus))
    if got is not None:
        result += " " + " ".join(
            f"secagg_plus_{what}_ratio_{k}c_drop10={got[j] / base[j]:.3f}"
            for what, j in (("client", 0), ("server", 1), ("bytes", 3))
        )
    print(result)


def whole_round(
    clients: int,
    model: str,
    pairs: int,
    data_dir: str | None,
    neighbours: int | None,
    warmup: int = 1,
) -> None:
    """Paired wall times of one round without secure aggregation, with SecAgg and,
    given ``neighbours``, with SecAgg+."""
    import torch

    from fedforge.config import from_dict
    from fedforge.data.federated import load_federated_data
    from fedforge.report.progress import Progress
    from fedforge.server.experiment import build
    from fedforge.server.round import run_round
    from fedforge.server.state import LoopState

    base = {
        "model": model,
        "num_clients": 100,
        "client_fraction": clients / 100,  # 100 clients of 600 MNIST samples
        "local_epochs": 1,
        "batch_size": 10,
        "rounds": 10_000,  # no evaluation inside the measured rounds
        "evaluation": {"every": 10_000},
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
    if neighbours:
        plus = {**secure, "secagg_neighbours": neighbours}
        exps["secagg+"] = build(from_dict({**base, "privacy": plus}), data)
    names = list(exps)
    states = {k: LoopState.fresh(e) for k, e in exps.items()}
    bar = Progress(1, "secagg", enabled=False)
    times: dict[str, list[float]] = {name: [] for name in names}
    bytes_up: dict[str, int] = {}
    for r in range(pairs + warmup):  # the first ``warmup`` blocks are not counted
        for name in names if (r - warmup) % 2 == 0 else names[::-1]:  # ABCCBA order
            t0 = time.perf_counter()
            record, _ = run_round(exps[name], states[name], r, bar)
            seconds = time.perf_counter() - t0
            print(
                f"block {r} {name}: {seconds:.2f} s{' (warm-up)' if r < warmup else ''}", flush=True
            )
            if r >= warmup:
                times[name].append(seconds)
                bytes_up[name] = record.bytes_up
    over = {n: [a / b for a, b in zip(times[n], times["plain"], strict=True)] for n in names}
    print(
        f"threads {torch.get_num_threads()}  {clients} clients  {model}  "
        f"10% drop after the masked input  neighbours {neighbours or 'all'}"
    )
    print(f"{'pair':>4} " + " ".join(f"{n + ' s':>10} {'ratio':>7}" for n in names))
    for i in range(pairs):
        print(f"{i:>4} " + " ".join(f"{times[n][i]:>10.2f} {over[n][i]:>7.3f}" for n in names))
    up = {n: bytes_up[n] / bytes_up["plain"] for n in names}
    print("bytes up per round: " + ", ".join(f"{n} {bytes_up[n]} ({up[n]:.3f}x)" for n in names))
    key = f"{clients}c_{'1m' if model == 'cnn' else model}_drop10"
    result = (
        f"RESULT secagg_overhead_{key}={float(np.median(over['secagg'])):.3f} "
        f"secagg_bytes_up_ratio={up['secagg']:.3f}"
    )
    if neighbours:
        paired = [a / b for a, b in zip(times["secagg+"], times["secagg"], strict=True)]
        result += (
            f" secagg_plus_overhead_{key}={float(np.median(over['secagg+'])):.3f} "
            f"secagg_plus_over_secagg={float(np.median(paired)):.3f} "
            f"secagg_plus_bytes_up_ratio={up['secagg+']:.3f}"
        )
    print(result)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--round", action="store_true", help="whole rounds with and without SecAgg")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--pairs", type=int, default=3, help="measured blocks")
    ap.add_argument("--warmup", type=int, default=1, help="blocks run first and not counted")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--neighbours", type=int, default=None, help="SecAgg+ with k neighbours too")
    args = ap.parse_args()
    if args.round:
        whole_round(
            args.clients, args.model, args.pairs, args.data_dir, args.neighbours, args.warmup
        )
        return
    protocol_grid(args.quick, args.neighbours)


if __name__ == "__main__":
    main()
