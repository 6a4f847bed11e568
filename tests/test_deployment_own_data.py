"""A deployment whose clients bring their own data (``deployment.client_data:
remote``, ``fedforge client --data PATH --client-id N``), with real processes on
loopback: it ends where the simulator ends on the same per-client rows (up to
the order the server sums the updates in), the server takes the clients' sizes
from their joins, a client evaluates on more held-out rows than it trains on,
and a client whose examples do not fit the federation's data spec is refused in
one line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch

from deploy_procs import run_dir_of, start_data_client, start_server, write_config
from fedforge import build, run
from fedforge import config as config_mod
from fedforge.data import from_tensors
from fedforge.data.mnist import MnistData, load_mnist
from fedforge.store.final import load_final
from fedforge.tasks import load_server_data

CLASSES = 10


def _folders(tmp: Path, mnist: MnistData) -> list[tuple[np.ndarray, np.ndarray]]:
    """Two clients' folders of MNIST rows (float32, scaled as the federation
    scales them): 30 rows plus 40 held-out ones in test.npz (more than it trains
    on); 45 rows of digits 0..4 only (fewer classes than the federation's)."""
    x, y = mnist.train_x.numpy(), mnist.train_y.numpy()
    low = np.flatnonzero(y < 5)
    out = []
    for k, rows in enumerate((np.arange(0, 30), low[low >= 100][:45])):
        folder = tmp / f"own-{k}"
        folder.mkdir()
        np.savez(folder / "train.npz", x=x[rows], y=y[rows])
        out.append((x[rows], y[rows]))
    np.savez(tmp / "own-0" / "test.npz", x=x[300:340], y=y[300:340])
    return out


@pytest.mark.slow
def test_clients_with_their_own_data_end_where_the_simulator_ends(
    tmp_path: Path, mnist_dir: Path
) -> None:
    cfg_path = write_config(
        tmp_path / "cfg.yaml",
        dataset="mnist",
        data_dir=str(mnist_dir),
        num_clients=2,
        client_fraction=1.0,
        deployment={"client_data": "remote", "start_clients": 2, "cold_start": True},
        robust={"max_weight_ratio": 10.0},
    )
    rows = _folders(tmp_path, load_mnist(mnist_dir))
    wrong = tmp_path / "wrong"  # flat rows where the federation's inputs are 1x28x28 images
    wrong.mkdir()
    np.savez(wrong / "train.npz", x=np.zeros((4, 784), np.float32), y=np.zeros(4, np.int64))
    server, port = start_server(tmp_path, cfg_path, "--insecure")
    # refused before it joins, on the spec the server sent (the id of a good one)
    refused = start_data_client(tmp_path, port, wrong, 0, "--insecure")
    clients = [
        start_data_client(tmp_path, port, tmp_path / f"own-{k}", k, "--insecure") for k in range(2)
    ]
    assert refused.wait(60) == 2, refused.log.read_text()
    assert (
        f"fedforge: error: {wrong / 'train.npz'}: array x rows have shape (784,); the "
        "federation's inputs have (1, 28, 28)" in refused.log.read_text()
    )
    assert server.wait(180) == 0, server.log.read_text()
    for c in clients:
        assert c.wait(60) == 0, c.log.read_text()
    run_dir = tmp_path / run_dir_of(server)
    deployed = load_final(run_dir)["params"]

    # the simulator on the same rows, each client's in the order of its file
    cfg = config_mod.override(config_mod.load(cfg_path), {"runs_dir": str(tmp_path / "sim")})
    test = load_server_data(cfg)  # the test set the server evaluated on (MNIST's)
    sizes = [len(y) for _, y in rows]
    bounds = np.cumsum([0, *sizes])
    data = from_tensors(
        np.concatenate([x for x, _ in rows]),
        np.concatenate([y for _, y in rows]),
        test.test_x,
        test.test_y,
        [np.arange(bounds[k], bounds[k + 1]) for k in range(2)],
        num_classes=CLASSES,
        dtype=torch.float64,
    )
    simulated = run(cfg, data=data).params
    assert deployed.dtype == torch.float64
    assert len(test.test_y) == 10_000 and len(test.train_y) == 0
    # within rounding, not bit for bit: the server adds the updates in the order
    # they arrive, the simulator in cohort order, and torch's add_(u, alpha=w) fuses
    # the multiply and the add, so the sum's last bits follow the order (7e-17
    # measured here); a wrong row, weight or step moves the result far past 1e-9
    assert (deployed - simulated).abs().max().item() <= 1e-9
    assert (deployed - build(cfg, data).initial_params).abs().max().item() > 1e-3  # it trained

    # the server's sizes are the clients' declarations; the cold start scored each
    # client's held-out examples when it has them, else its training rows
    assert json.loads((run_dir / "partition.json").read_text())["sizes"] == sizes
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        cold = dict(db.execute("SELECT client_id, num_examples FROM cold_start").fetchall())
    assert cold == {0: 40, 1: 45}
