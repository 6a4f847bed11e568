"""examples/power_of_choice.py (Cho, Wang and Joshi 2020, rpow-d), written on the
public API: its choice on a small history worked by hand, its candidate draw
against the n_k-proportional law, a run resumed after SIGKILL asking the same
cohorts, the serial and the vectorised engine asking the same cohorts, and a
deployment of real processes asking the simulator's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

import fedforge
from deploy_procs import run_dir_of, start_client, start_server, write_config
from deploy_sim import _participants
from examples_loaded import EXAMPLES, load_example
from fedforge.config import from_dict
from fedforge.core import registry
from fedforge.core.errors import ConfigError
from fedforge.selection.history import History
from fedforge.store import RunStore
from fedforge.store.final import load_final

EXAMPLE = EXAMPLES / "power_of_choice.py"
RUN: dict[str, Any] = {
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 20,
    "client_fraction": 0.2,
    "batch_size": None,  # one step an epoch: a quick run
    "rounds": 8,
    "engine": "serial",
    "checkpoint_every": 2,
    "target_accuracy": None,
    "dtype": "float64",
    "plugins": [str(EXAMPLE)],
    "selection": {"policy": "pow_d"},
    "plugin_options": {"pow_d": {"d": 8}},
}


@pytest.fixture(scope="module")
def pow_d() -> Iterator[Any]:
    module = load_example("power_of_choice")
    yield module
    registry.unregister("selection", "pow_d")


def _ask(among: list[int], size: int, sizes: list[int], history: History, seed: int = 0) -> Any:
    view = history.view(sizes)
    return fedforge.SelectionRound(0, among, size, view, np.random.default_rng(seed))


def test_the_highest_last_losses_of_the_candidates_never_seen_first(pow_d: Any) -> None:
    """Six clients; 0 and 3 hold no examples, so the d = 4 candidates drawn by n_k
    are 1, 2, 4, 5 whatever the draw. Last losses: 1: 0.5, 4: 2.0, 5: 1.0; 2 was
    never taken (asked once, dropped); 0 and 3 have the largest losses but are
    no candidates. Two asked: 2 (unknown first), then 4 (2.0); three: and 5 (1.0)."""
    history = History()
    history.round_done(0, 0, [0, 1, 2, 3], [0, 1, 3], {0: 9.0, 1: 0.5, 3: 8.0}, [])
    history.round_done(1, 1, [4, 5], [4, 5], {4: 2.0, 5: 1.0}, [])
    sizes = [0, 10, 20, 0, 30, 40]
    policy = pow_d.PowerOfChoice(4)
    for seed in range(20):  # any draw of the candidates
        assert sorted(policy.select(_ask(list(range(6)), 2, sizes, history, seed))) == [2, 4]
        assert sorted(policy.select(_ask(list(range(6)), 3, sizes, history, seed))) == [2, 4, 5]
    # d = all six: the two highest losses of all, none unknown
    history.round_done(2, 2, [2], [2], {2: 0.1}, [])
    got = pow_d.PowerOfChoice(6).select(_ask(list(range(6)), 2, sizes, history))
    assert sorted(got) == [0, 3]
    # a deployment's pool: only those there are candidates
    got = pow_d.PowerOfChoice(3).select(_ask([1, 2, 5], 1, sizes, history))
    assert got == [5]


def test_the_candidates_are_drawn_in_proportion_to_n_k(pow_d: Any) -> None:
    """With d = 1 and one asked, the cohort is the one candidate: client k is asked
    with probability n_k / sum n (4000 draws, 5 standard errors)."""
    sizes = [10, 30, 60, 100]
    policy, history = pow_d.PowerOfChoice(1), History()
    counts = np.zeros(4)
    for seed in range(4000):
        counts[policy.select(_ask([0, 1, 2, 3], 1, sizes, history, seed))[0]] += 1
    p = np.array(sizes) / sum(sizes)
    assert np.all(np.abs(counts / 4000 - p) <= 5 * np.sqrt(p * (1 - p) / 4000))


def test_d_is_checked_in_one_line(pow_d: Any, tmp_path: Path) -> None:
    for d, said in ((0, "d = 0 must be an integer >= 1"), (21, "d = 21 must be at most 20")):
        cfg = from_dict({**RUN, "runs_dir": str(tmp_path), "plugin_options": {"pow_d": {"d": d}}})
        with pytest.raises(ConfigError) as err:
            fedforge.build(cfg)
        assert "\n" not in str(err.value) and said in str(err.value)


def test_secure_aggregation_refuses_it_in_one_line(pow_d: Any, tmp_path: Path) -> None:
    """Under SecAgg no loss reaches the server: the policy, which ranks by them,
    is refused rather than left to choose by example counts alone."""
    secure = {"privacy": {"secagg": True}, "communication": {"clip_norm": 1.0}}
    cfg = from_dict({**RUN, "runs_dir": str(tmp_path), **secure})
    with pytest.raises(ConfigError) as err:
        fedforge.build(cfg)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("selection.policy = 'pow_d' ranks clients by the training losses")


def _cohorts(run_dir: Path) -> list[tuple[int, int]]:
    with RunStore.open(run_dir) as store:
        return [(c.round_idx, c.client_id) for c in store.client_rounds()]


def test_the_serial_and_vectorised_engines_ask_the_same_cohorts(pow_d: Any, tmp_path: Path) -> None:
    runs = {}
    for engine in ("serial", "vectorized"):
        cfg = from_dict({**RUN, "engine": engine, "runs_dir": str(tmp_path / engine)})
        runs[engine] = fedforge.run(cfg)
    serial, vectorised = (_cohorts(r.run_dir) for r in runs.values())
    assert serial == vectorised and len(serial) == 8 * 4
    assert len({c for _, c in serial}) > 4 * 2  # not one fixed cohort
    diff = (runs["serial"].params - runs["vectorized"].params).abs().max().item()
    assert diff <= 1e-9


CHILD = """
import sys, time
from pathlib import Path
import fedforge
from fedforge.config import load

class Slow(fedforge.RoundHook):
    name = "slow"
    def round_end(self, info, end):
        time.sleep(0.3)

if sys.argv[1] == "run":
    fedforge.run(load(sys.argv[2]), hooks=[Slow()])
else:
    fedforge.resume(sys.argv[2])
"""


def test_a_run_killed_by_sigkill_resumes_asking_the_same_cohorts(
    pow_d: Any, tmp_path: Path
) -> None:
    """Killed after its third round (checkpointed at the second), resumed: the
    cohorts, hence the records and the model, are the uninterrupted run's (the
    history the policy reads comes back from the checkpoint)."""
    reference = fedforge.run(from_dict({**RUN, "runs_dir": str(tmp_path / "ref")}))
    runs = tmp_path / "runs"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**RUN, "runs_dir": str(runs)}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.Popen(
        [sys.executable, "-c", CHILD, "run", str(cfg)], env=env, stderr=subprocess.PIPE
    )
    deadline, run_dir = time.monotonic() + 60, None
    while time.monotonic() < deadline and run_dir is None:
        for stream in runs.glob("[!.]*/metrics.jsonl"):
            if len(stream.read_text().splitlines()) >= 3:
                run_dir = stream.parent
        assert killed.poll() is None, killed.communicate()
        time.sleep(0.01)
    assert run_dir is not None, "the run did not record 3 rounds in 60 s"
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(30)
    with RunStore.open(run_dir) as store:
        assert store.status == "running" and 3 <= len(store.rounds()) < 8
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "resume", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert _cohorts(run_dir) == _cohorts(reference.run_dir)
    got, want = load_final(run_dir)["params"], load_final(reference.run_dir)["params"]
    assert got.dtype == torch.float64 and (got - want).abs().max().item() <= 1e-9


def test_a_deployment_asks_the_simulators_cohorts(pow_d: Any, tmp_path: Path) -> None:
    """A ``fedforge server`` and two client processes, the plugin named by the
    config: each round the clients that trained are the simulator's."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        plugins=[str(EXAMPLE)],
        selection={"policy": "pow_d"},
        plugin_options={"pow_d": {"d": 4}},
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
    assert server.wait(180) == 0, server.log.read_text()
    for c in clients:
        assert c.wait(60) == 0, c.log.read_text()
    deployed = _participants(tmp_path / run_dir_of(server))
    sim_cfg = fedforge.override(fedforge.load(cfg), {"runs_dir": str(tmp_path / "sim")})
    simulated = _participants(fedforge.run(sim_cfg).run_dir)
    assert deployed == simulated and len(deployed) == 3
