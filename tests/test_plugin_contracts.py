"""Contracts a user's component cannot slip out of: a round hook that writes the
model or keeps state JSON cannot hold fails the run in one line naming it; an
algorithm's client half without tables takes worker processes (and gives what
one process gives); a stateless client half's tables are its own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import fedforge
from examples_loaded import load_example
from fedforge.algorithms import PendingClientTable, StatelessClientTerms
from fedforge.config import Config, override
from fedforge.core.plugin_versions import file_digest as fedforge_digest
from fedforge.engines import close_engine
from fedforge.server.hooks import HookError, RoundHook, RoundInfo
from fedforge.store import make_state_store

ROOT = Path(__file__).resolve().parents[1]


def small(tmp: Path, **extra: Any) -> Config:
    base = {
        "dataset": "synthetic", "model": "logreg", "num_clients": 8, "client_fraction": 0.5,
        "rounds": 2, "target_accuracy": None, "dtype": "float64", "engine": "serial",
        "runs_dir": str(tmp), "batch_size": 10, "lr": 0.05, "checkpoint_every": 1,
    }  # fmt: skip
    return override(Config(), {**base, **extra})


class Writer(RoundHook):
    name = "writer"

    def round_start(self, info: RoundInfo) -> None:
        info.params.add_(1.0)


@pytest.mark.parametrize(
    "state, why",
    [
        ({"seen": {1: 2}}, "would not come back from the checkpoint as it is"),
        ({"seen": (1, 2)}, "would not come back"),
        ({"norm": torch.ones(2)}, "is not JSON"),
    ],
)
def test_a_hook_state_json_cannot_hold_fails_in_one_line(
    tmp_path: Path, state: dict[str, Any], why: str
) -> None:
    class Keeper(RoundHook):
        name = "keeper"

        def state_dict(self) -> dict[str, Any]:
            return state

    with pytest.raises(HookError, match=f"round hook 'keeper': its state_dict.. {why}"):
        fedforge.run(small(tmp_path), hooks=[Keeper()], progress=False)


def test_a_hook_state_with_nan_and_nesting_is_kept(tmp_path: Path) -> None:
    class Keeper(RoundHook):
        name = "keeper"

        def state_dict(self) -> dict[str, Any]:
            return {"loss": float("nan"), "by_client": {"3": [1, 2.5, None, "x", True]}}

    fedforge.run(small(tmp_path), hooks=[Keeper()], progress=False)


def test_a_hook_that_writes_the_model_fails_naming_it(tmp_path: Path) -> None:
    with pytest.raises(HookError, match=r"round hook 'writer' wrote the round's model .* round 1"):
        fedforge.run(small(tmp_path), hooks=[Writer()], progress=False)


class Counts(StatelessClientTerms):
    """Sends its client's example count beside the delta; keeps nothing."""

    def end(self, job: Any) -> dict[str, torch.Tensor]:
        return {"n": torch.tensor([float(len(job.y))], dtype=job.start.dtype)}


def test_a_stateless_client_half_has_tables_of_its_own() -> None:
    a, b = Counts(), Counts()
    a.tables["x"] = make_state_store(2, 3, torch.float64)  # type: ignore[index]
    assert dict(b.tables) == {} and dict(a.tables) == {}
    store = make_state_store(2, 3, torch.float64)
    held = PendingClientTable("grad", store)
    assert dict(held.tables) == {"grad": store} and dict(Counts().tables) == {}


@pytest.mark.all_cores
def test_an_algorithm_without_client_tables_takes_worker_processes(tmp_path: Path) -> None:
    """examples/fednova.py sends scalars and keeps no table: two worker processes
    run it, and end where one process ends, bit for bit."""
    fedforge.load_plugin(str(ROOT / "examples" / "fednova.py"))
    cfg = small(tmp_path, algorithm="fednova", aggregation={"weights": "num_examples"})
    exp = fedforge.build(override(cfg, {"workers": 2}))
    try:
        assert type(exp.engine).__name__ == "PoolEngine", exp.engine
    finally:
        close_engine(exp.engine)
    one = fedforge.run(override(cfg, {"workers": 1, "name": "one"}), progress=False)
    two = fedforge.run(override(cfg, {"workers": 2, "name": "two"}), progress=False)
    assert torch.equal(one.params, two.params)


F64 = torch.float64


def test_fednova_takes_the_headers_count_and_a_step_count_its_plan_allows() -> None:
    """A client of 25 examples, E = 2, B = 10: at most 2 x 3 = 6 steps. Its word
    for n_i must be the header's, a_i in [1, 6]: a liar is refused, not obeyed."""
    nova = load_example("fednova")
    server = nova.NovaServer(fedforge.LocalPlan(local_epochs=2, batch_size=10, lr=0.1))
    delta = torch.zeros(3, dtype=F64)

    def said(n: float, a: float) -> dict[str, torch.Tensor]:
        return {"n_a": torch.tensor([n * a], dtype=F64), "n": torch.tensor([n], dtype=F64)}

    kept = server.admit(delta, said(25, 6), 25)
    assert kept == {"n_a": torch.tensor([150.0], dtype=F64), "n": torch.tensor([25.0], dtype=F64)}
    for n, a, why in [(25, 6000, "a_i = 6000"), (2500, 6, "n_i = 2500"), (25, 0.5, "a_i = 0.5")]:
        with pytest.raises(ValueError, match=why):
            server.admit(delta, said(n, a), 25)


def test_feddyn_and_fedexp_count_and_measure_the_update_themselves() -> None:
    dyn = load_example("feddyn").DynServer(0.01, 10)
    delta = torch.tensor([3.0, 4.0], dtype=F64)
    assert dyn.update_tensors == ()
    assert torch.equal(dyn.admit(delta, {}, 7)["count"], torch.ones(1, dtype=F64))
    exp = load_example("fedexp").SquaredNorms()
    assert exp.update_tensors == ()
    assert torch.equal(
        exp.admit(delta, {"sq": torch.tensor([1e9])}, 7)["sq"], torch.tensor([25.0], dtype=F64)
    )


def test_qfedavg_refuses_an_h_that_is_not_positive_and_survives_a_zero_loss() -> None:
    q = load_example("qfedavg")
    with pytest.raises(ValueError, match="h_k = -1.0 must be > 0"):
        q.PositiveH().admit(torch.zeros(2), {"h": torch.tensor([-1.0])}, 3)
    # h_k = q F^(q-1) ||Delta w||^2 + L F^q, by hand: q = 0.5, L = 2, F = 4, ||Delta w||^2 = 9
    assert q.h_of(4.0, 0.5, 2.0, 9.0) == 0.5 * 4.0**-0.5 * 9.0 + 2.0 * 2.0
    assert q.h_of(0.0, 0.5, 2.0, 9.0) == 0.0  # F = 0, q < 1: no share of the step
    assert q.h_of(0.0, 1.0, 2.0, 9.0) == 9.0  # q = 1: F^0 = 1
    assert q.h_of(3.0, 0.0, 2.0, 9.0) == 2.0  # q = 0: FedAvg's L


KILLED_RUN = """
import json, os, signal, sys
from pathlib import Path
import fedforge
from fedforge.config import from_dict
from fedforge.server.hooks import RoundHook

fedforge.load_plugin(sys.argv[1])


class Tally(RoundHook):
    name = "tally"

    def __init__(self, kill_round):
        self.total, self.kill_round = 0.0, kill_round

    def round_end(self, info, end):
        self.total += float(info.state.params[0])
        if info.round_idx == self.kill_round:
            os.kill(os.getpid(), signal.SIGKILL)

    def state_dict(self):
        return {"total": self.total}

    def load_state_dict(self, state):
        self.total = state["total"]


cfg = from_dict(json.loads(sys.argv[2]))
hook = Tally(int(sys.argv[3]))
if sys.argv[4] == "resume":
    run_dir = next(p for p in Path(cfg.runs_dir).iterdir() if p.is_dir())
    result = fedforge.resume(run_dir, hooks=[hook], progress=False)
else:
    result = fedforge.run(cfg, hooks=[hook], progress=False)
print(json.dumps({"params": [x.hex() for x in result.params.tolist()], "total": hook.total.hex()}))
"""


FEDDYN_RUN = {
    "dataset": "synthetic", "model": "logreg", "num_clients": 8, "client_fraction": 0.5,
    "rounds": 5, "target_accuracy": None, "dtype": "float64", "engine": "serial",
    "batch_size": 10, "lr": 0.05, "checkpoint_every": 2, "algorithm": "feddyn",
    "aggregation": {"weights": "uniform"}, "plugin_options": {"feddyn": {"alpha": 0.3}},
    "local": {"momentum": 0.5},
}  # fmt: skip


def _killed_run(
    tmp_path: Path, plugin: Path, runs: str, kill_round: int, mode: str
) -> subprocess.CompletedProcess[str]:
    """KILLED_RUN in its own process: FedDyn from ``plugin`` with a stateful hook,
    killed at the end of round ``kill_round`` (-1: never), or resumed."""
    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN)
    cfg = json.dumps({**FEDDYN_RUN, "runs_dir": str(tmp_path / runs)})
    argv = [str(plugin), cfg, str(kill_round), mode]
    return subprocess.run(
        [sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120
    )


def test_feddyn_and_a_stateful_hook_resume_exactly_after_sigkill(tmp_path: Path) -> None:
    """examples/feddyn.py (a client table, server state h) with a hook keeping a
    running total: killed with SIGKILL at the end of round 3 of 5, then resumed,
    both end bit for bit where an uninterrupted run ends."""
    plugin = ROOT / "examples" / "feddyn.py"
    whole = _killed_run(tmp_path, plugin, "whole", -1, "run")
    assert whole.returncode == 0, whole.stderr
    killed = _killed_run(tmp_path, plugin, "killed", 2, "run")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = _killed_run(tmp_path, plugin, "killed", -1, "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == json.loads(whole.stdout)


def test_a_run_resumes_only_with_the_plugins_it_started_with(tmp_path: Path) -> None:
    """build.json records the plugins a run's components came from (name, version):
    the plugin file edited between the kill and the resume is refused in one line
    naming both versions, and the same file resumes."""
    plugin = tmp_path / "plugins" / "feddyn.py"
    plugin.parent.mkdir()
    plugin.write_text((ROOT / "examples" / "feddyn.py").read_text())
    killed = _killed_run(tmp_path, plugin, "killed", 2, "run")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run_dir = next(p for p in (tmp_path / "killed").iterdir() if p.is_dir())
    build = json.loads((run_dir / "build.json").read_text())
    assert build["plugins"] == {"feddyn.py": [fedforge_digest(plugin), "algorithm 'feddyn'"]}, (
        build["plugins"]
    )
    was = fedforge_digest(plugin)
    plugin.write_text(plugin.read_text() + "# another version\n")
    edited = _killed_run(tmp_path, plugin, "killed", -1, "resume")
    assert edited.returncode != 0
    said = (
        f"cannot be resumed as it started: it used plugin 'feddyn.py' version {was}, "
        f"now {fedforge_digest(plugin)} (algorithm 'feddyn')"
    )
    assert said in edited.stderr, edited.stderr[-2000:]
    plugin.write_text(plugin.read_text().removesuffix("# another version\n"))
    resumed = _killed_run(tmp_path, plugin, "killed", -1, "resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
