"""The deployment benchmark's part ``remote`` (benchmarks/deployment.py): the
same MNIST CNN federation with ``deployment.client_data: remote``, each client
process reading its clients' own folders (``fedforge client --data ROOT
--client-id 0-24``, ``ROOT/<id>/train.npz``) written from the simulator's
partition, so the server holds the test set alone.

Figures: the server's peak RSS with its clients connected (``server_rss_mib``,
for each ``--fractions`` C), the model's size, and the largest difference of the
final parameters from the ``cnn`` part's deployment of the same config on the
simulator's partition (the same rows trained in the same order: 0 expected).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from deploy_lab import mean_round, mib, split, store_file
from fedforge import config as config_mod
from fedforge.data.federated import load_federated_data
from fedforge.store.final import load_final


def write_folders(config: Path, root: Path) -> Path:
    """Each client's rows of the config's partition as ``root/<id>/train.npz``."""
    cfg = config_mod.load(config)
    data = load_federated_data(cfg)
    for k in range(cfg.num_clients):
        x, y = data.client_data(k)
        (root / str(k)).mkdir(parents=True)
        np.savez(root / str(k) / "train.npz", x=x.numpy(), y=y.numpy())
    return root


def own_data(b: Any, out: dict[str, Any]) -> None:
    """Deploy the ``cnn`` part's configs with the clients' own data (``b``: the
    benchmark's Bench)."""
    a, n = b.args, b.n
    groups = split(list(range(n)), a.procs)
    fractions = [float(f) for f in a.fractions.split(",")]
    rounds = [int(r) for r in a.rounds.split(",")]
    rounds += [rounds[-1]] * (len(fractions) - len(rounds))
    folders: Path | None = None
    out["remote"] = {}
    for frac, nr in zip(fractions, rounds, strict=False):
        tag = f"c{round(frac * 100)}"
        remote = {"client_data": "remote"}
        row = "cnn_iid_e1_b10"
        cfg = b.config(
            f"remote_{tag}",
            row,
            client_fraction=frac,
            rounds=nr,
            deployment=remote,
            robust={"max_weight_ratio": 10.0},
        )
        if folders is None:
            folders = write_folders(cfg, b.lab.root / "own")
        print(f"C={frac:g}, the clients' own data: {nr} rounds, {len(groups)} processes")
        db, server = b.deploy(f"deploy_remote_{tag}", cfg, groups, data=folders)
        params = load_final(db.parent)["params"]
        rec: dict[str, Any] = {
            "rounds": nr,
            "deploy_round_s": mean_round(db),
            "server_rss_mib": mib(server.maxrss_kib),
            "model_mib": params.numel() * params.element_size() / 2**20,
        }
        partition = store_file(b.lab.root / f"deploy_{tag}")
        if partition is not None and nr == out["cnn"].get(tag, {}).get("rounds"):
            same = load_final(partition.parent)["params"]
            rec["maxdiff_vs_partition"] = float((params - same).abs().max())
        print(
            f"  server peak RSS {rec['server_rss_mib']:.0f} MiB (model {rec['model_mib']:.1f} "
            f"MiB), {rec['deploy_round_s']:.2f} s/round, final params vs the partition's "
            f"deployment: {rec.get('maxdiff_vs_partition', 'not run')}",
            flush=True,
        )
        out["remote"][tag] = rec
