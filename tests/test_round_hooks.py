"""Round hooks (server/hooks.py): a user's hook sees a real run's lifecycle as the
run store records it, runs after the built-in hooks in the documented order,
and a stateful one resumed after SIGKILL ends as an uninterrupted run's."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fedforge
from fedforge.config import Config, override
from fedforge.server.builtin_hooks import run_hooks
from fedforge.server.hooks import RoundEnd, RoundHook, RoundInfo
from fedforge.server.loop import run
from fedforge.server.result import RunResult

ROOT = Path(__file__).resolve().parents[1]


def attacked(tmp: Path, **extra: Any) -> Config:
    """Ten synthetic clients, two of them scaling their updates 50x: the norm gate
    refuses them every round."""
    base = {
        "dataset": "synthetic", "model": "logreg", "num_clients": 10, "client_fraction": 1.0,
        "rounds": 4, "target_accuracy": None, "dtype": "float64", "engine": "serial",
        "runs_dir": str(tmp), "batch_size": 10, "lr": 0.01, "checkpoint_every": 0,
        "evaluation.every": 2, "robust.norm_gate": 3.5, "robust.attack": "scaled",
        "robust.attack_fraction": 0.2, "robust.attack_scale": 50.0,
    }  # fmt: skip
    return override(Config(), {**base, **extra})


class Recorder(RoundHook):
    """Writes down every call, in order."""

    def __init__(self, name: str = "recorder", calls: list[tuple[Any, ...]] | None = None) -> None:
        self.name = name
        self.calls: list[tuple[Any, ...]] = [] if calls is None else calls

    def round_start(self, info: RoundInfo) -> None:
        self.calls.append((self.name, "start", info.round_idx, info.kind))

    def upload(self, info: RoundInfo, client_id: int, taken: bool, reason: str | None) -> None:
        self.calls.append((self.name, "upload", info.round_idx, client_id, taken, reason))

    def evaluated(self, info: RoundInfo, accuracy: float, loss: float) -> None:
        self.calls.append((self.name, "evaluated", info.round_idx, accuracy, loss))

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        self.calls.append((self.name, "end", info.round_idx, end.record, end.used))

    def run_end(self, result: RunResult) -> None:
        self.calls.append((self.name, "run_end", len(result.rounds)))


def test_a_users_hook_sees_the_run_the_store_records(tmp_path: Path) -> None:
    hook = Recorder()
    result = fedforge.run(attacked(tmp_path), hooks=[hook])
    assert result.run_dir is not None
    db = sqlite3.connect(result.run_dir / "store.sqlite")
    rounds = db.execute("SELECT round_idx, test_accuracy, test_loss FROM rounds").fetchall()
    refused = db.execute(
        "SELECT round_idx, client_id, reason FROM anomalies WHERE client_id IS NOT NULL"
    ).fetchall()
    took = db.execute("SELECT round_idx, client_id FROM client_rounds").fetchall()
    db.close()
    calls = hook.calls
    # every round starts and ends, in order, and nothing of a round falls outside
    marks = [(c[1], c[2]) for c in calls if c[1] in ("start", "end")]
    assert marks == [(m, r) for r in range(4) for m in ("start", "end")]
    for r in range(4):
        inside = [i for i, c in enumerate(calls) if c[1] != "run_end" and c[2] == r]
        first, last = inside[0], inside[-1]
        assert calls[first][1] == "start" and calls[last][1] == "end"
        assert inside == list(range(first, last + 1))
    assert calls[-1] == ("recorder", "run_end", 4) and sum(c[1] == "run_end" for c in calls) == 1
    # refused uploads with their reasons: the store's anomalies, among them the two
    # attackers (clients 3 and 5 of this seed) every round
    got_refused = [(c[2], c[3], c[5]) for c in calls if c[1] == "upload" and not c[4]]
    assert sorted(got_refused) == sorted(refused)
    attackers = {(r, c): why for r, c, why in got_refused if c in (3, 5)}
    assert len(attackers) == 2 * 4 and all("update norm" in w for w in attackers.values())
    # uploads taken: the store's client rows; every upload is either taken or refused
    got_taken = [(c[2], c[3]) for c in calls if c[1] == "upload" and c[4]]
    assert sorted(got_taken) == sorted(took)
    assert sorted([*got_taken, *((r, c) for r, c, _ in got_refused)]) == [
        (r, c) for r in range(4) for c in range(10)
    ]
    # evaluations: rounds 2 and 4 (evaluation.every 2), their scores as recorded
    got_evals = [(c[2], c[3], c[4]) for c in calls if c[1] == "evaluated"]
    assert got_evals == [r for r in rounds if r[1] is not None] and len(got_evals) == 2
    # each round's end carries the round's record and whose updates the model took
    ends = [c for c in calls if c[1] == "end"]
    assert [e[3] for e in ends] == result.rounds
    assert [e[4] for e in ends] == [sorted(c for q, c in took if q == r) for r in range(4)]


def test_hooks_run_in_the_documented_order(tmp_path: Path) -> None:
    """Built-ins first (privacy, diagnostics, client state, selection, alerts), then
    the user's in the order given; at a user's round start the built-ins' work of
    that point is done (the round's drift figures set up), and at its round end
    the diagnostics rows are out and SCAFFOLD's c_k+ committed."""
    calls: list[tuple[Any, ...]] = []
    seen: list[tuple[bool, bool, bool, int]] = []

    class Checks(Recorder):
        def round_start(self, info: RoundInfo) -> None:
            super().round_start(info)
            seen.append((False, info.diagnostics is not None, False, -1))

        def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
            super().round_end(info, end)
            terms = info.exp.algorithm.client
            assert terms is not None
            rows = "diagnostics" in info.state.outputs
            kept = len(terms.tables["control"].written())
            seen.append((False, rows, terms.pending() == {}, kept))

    no_attack = {"robust.attack": "none", "robust.attack_fraction": 0.0}
    cfg = attacked(tmp_path, rounds=2, algorithm="scaffold", **no_attack)
    first, second = Checks("first", calls), Recorder("second", calls)
    names = [h.name for h in run_hooks([first, second])]
    builtin = ["privacy", "diagnostics", "client_state", "selection", "alerts"]
    assert names == [*builtin, "first", "second"]
    fedforge.run(cfg, hooks=[first, second])
    starts = [c[0] for c in calls if c[1] == "start"]
    assert starts == ["first", "second"] * 2
    pairs = [(c[0], c[1], c[2]) for c in calls if c[1] in ("upload", "end")]
    assert pairs[0::2] == [("first",) + p[1:] for p in pairs[1::2]]  # each point: first, second
    assert seen == [(False, True, False, -1), (False, True, True, 10)] * 2


def test_hook_names_are_unique(tmp_path: Path) -> None:
    with pytest.raises(fedforge.ConfigError, match=r"round hook name\(s\) \['diagnostics'\]"):
        fedforge.run(attacked(tmp_path, rounds=1), hooks=[Recorder("diagnostics")])


class Tally(RoundHook):
    """A stateful hook: counts and float sums over the run, checkpointed."""

    name = "tally"

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"ends": 0, "refused": [], "loss_sum": 0.0, "acc": []}

    def upload(self, info: RoundInfo, client_id: int, taken: bool, reason: str | None) -> None:
        if not taken:
            self.state["refused"].append([info.round_idx, client_id])

    def evaluated(self, info: RoundInfo, accuracy: float, loss: float) -> None:
        self.state["acc"].append(accuracy)

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        self.state["ends"] += 1
        self.state["loss_sum"] += end.record.train_loss * 1.1
        if os.environ.get("TALLY_SLOW"):  # the killed run: time to kill it mid-run
            time.sleep(0.3)

    def state_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.state))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = json.loads(json.dumps(state))


CHILD = """
import json, sys
from pathlib import Path
from tests.test_round_hooks import Tally, attacked
from fedforge.server.loop import resume, run
tally = Tally()
if sys.argv[1] == "run":
    cfg = attacked(Path(sys.argv[2]), rounds=8, checkpoint_every=1, evaluation={"every": 1})
    run(cfg, hooks=[tally])
else:
    resume(sys.argv[2], hooks=[tally])
Path(sys.argv[3]).write_text(json.dumps(tally.state))
"""


@pytest.mark.slow  # the default suite: its twin in test_plugin_contracts / test_deployment_plugins
def test_a_stateful_hook_resumed_after_sigkill_continues_exactly(tmp_path: Path) -> None:
    want = Tally()
    run(
        attacked(tmp_path / "ref", rounds=8, checkpoint_every=1, evaluation={"every": 1}),
        hooks=[want],
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = tmp_path / "runs"
    killed = subprocess.Popen(
        [sys.executable, "-c", CHILD, "run", str(runs), str(tmp_path / "never.json")],
        cwd=ROOT,
        env={**env, "TALLY_SLOW": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    run_dir = None
    while time.monotonic() < deadline:
        streams = list(runs.glob("[!.]*/metrics.jsonl"))
        if streams and len(streams[0].read_text().splitlines()) >= 3:
            run_dir = streams[0].parent
            break
        assert killed.poll() is None, killed.communicate()
        time.sleep(0.01)
    assert run_dir is not None, "the run did not record 3 rounds in 60 s"
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert not (tmp_path / "never.json").exists()  # killed mid-run
    out = tmp_path / "resumed.json"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "resume", str(run_dir), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(out.read_text())
    assert got["ends"] == 8 and len(got["acc"]) == 8 and len(got["refused"]) >= 2 * 8
    assert got == want.state  # JSON floats round-trip exactly: bit-identical sums
