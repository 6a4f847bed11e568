"""Issue 4 part B.5: sweeps (resumable, one table) and the IID control experiment."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from fedforge.cli import main
from fedforge.config import describe_split, from_dict
from fedforge.core.errors import ConfigError
from fedforge.server.sweep import PointResult, grid_points, iid_config, knee, parse_grid
from fedforge.store import list_runs

TINY = {
    "name": "tiny",
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 4,
    "client_fraction": 1.0,
    "batch_size": 20,
    "lr": 0.01,
    "rounds": 2,
    "target_accuracy": 0.5,
    "dtype": "float64",
    "checkpoint_every": 0,
}


def test_grid_is_the_product_first_key_slowest() -> None:
    grid = parse_grid(["local_epochs=1,5", "fedprox.mu=0,0.01,null"])
    assert grid == [("local_epochs", [1, 5]), ("fedprox.mu", [0, 0.01, None])]
    points = grid_points(grid)
    assert points[:4] == [
        {"local_epochs": 1, "fedprox.mu": 0},
        {"local_epochs": 1, "fedprox.mu": 0.01},
        {"local_epochs": 1, "fedprox.mu": None},
        {"local_epochs": 5, "fedprox.mu": 0},
    ]
    assert len(points) == 6
    with pytest.raises(ConfigError, match="key=v1,v2"):
        parse_grid(["local_epochs"])
    with pytest.raises(ConfigError, match="repeat"):
        parse_grid(["fedprox.mu=1", "fedprox.mu=2"])


def _point(total: int, best: float) -> PointResult:
    return PointResult({}, None, "finished", 1, best, best, None, total)


def test_knee_by_hand() -> None:
    # scaled: x = 0, 1/3, 2/3, 1; y = 0, 0.4/0.47, 0.45/0.47, 1; heights above the
    # chord y = x: 0.518 (second point), 0.291 (third)
    rows = [_point(4, 0.97), _point(1, 0.5), _point(2, 0.9), _point(3, 0.95)]
    assert knee(rows) == 2
    assert knee(rows[:2]) is None
    assert knee([_point(1, 0.5), _point(2, 0.6), _point(3, 0.7)]) is None  # a straight line
    # no trade-off: the same bytes (or the same accuracy) everywhere has no knee
    assert knee([_point(5, 0.5), _point(5, 0.9), _point(5, 0.7)]) is None
    noise = [_point(946_760, 0.5), _point(946_763, 0.9), _point(946_767, 0.7)]
    assert knee(noise) is None  # 7 bytes of header digits apart: no trade-off
    assert knee([_point(1, 0.9), _point(2, 0.9), _point(3, 0.9)]) is None


def test_a_point_refused_at_build_still_prints_the_finished_points(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_thread: None
) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, "runs_dir": str(tmp_path / "runs")}))
    argv = ["sweep", str(path), "--set", "robust.aggregator=median"]
    argv += ["--grid", "communication.groups=0,2", "-q"]
    assert main(argv) == 2  # groups need the streaming mean: refused when the point builds
    captured = capsys.readouterr()
    table = captured.out[captured.out.index("communication.groups  ROUNDS") :]
    assert "BEST" in table and len(table.strip().splitlines()) == 2  # the finished point
    assert "communication.groups = 2" in captured.err


def test_grid_points_that_resolve_to_one_run_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, "runs_dir": str(tmp_path / "runs")}))
    argv = ["sweep", str(path), "--grid", "algorithm=fedsgd", "--grid", "local_epochs=1,5"]
    assert main([*argv, "-q"]) == 2  # fedsgd forces E = 1: two labels, one run
    assert not (tmp_path / "runs").exists()


def test_a_rerun_reuses_points_however_runs_dir_is_spelled_and_skips_unreadable_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    import sqlite3

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    argv = ["sweep", str(path), "--grid", "lr=0.01", "-q"]
    for spelling in ("s", "s/", str(tmp_path / "s"), "./s"):
        assert main([*argv, "--runs-dir", spelling]) == 0
    (run,) = list_runs(tmp_path / "s")
    # a same-named run whose config this version refuses: not this job, not a blocker
    conn = sqlite3.connect(run.path / "store.sqlite")
    conn.execute("UPDATE runs SET config_json = ?", ('{"lr": -1, "name": "tiny-lr=0.01"}',))
    conn.commit()
    conn.close()
    assert main([*argv, "--runs-dir", "s"]) == 0
    assert len(list_runs(tmp_path / "s")) == 2


def test_sweep_two_points_end_to_end_and_resumable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_thread: None
) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, "runs_dir": str(tmp_path / "runs")}))
    argv = ["sweep", str(path), "--grid", "lr=0.01,0.05", "-q"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    table = out[out.index("lr  ") :]
    assert "0.01" in table and "0.05" in table and "BEST" in table
    runs = list_runs(tmp_path / "runs")
    assert sorted(r.name for r in runs) == ["tiny-lr=0.01", "tiny-lr=0.05"]
    assert all(r.status == "finished" for r in runs)
    # again: both points are finished, nothing runs
    assert main(argv) == 0
    assert len(list_runs(tmp_path / "runs")) == 2
    # a point killed before its first checkpoint (checkpoint_every 0): resumed
    # from round 0 in its own folder, not left 'died' beside a new run
    import sqlite3

    killed = next(r for r in runs if r.name == "tiny-lr=0.05").path
    with sqlite3.connect(killed / "store.sqlite") as conn:
        conn.execute("UPDATE runs SET status = 'running', summary_json = NULL")
    assert [r.status for r in list_runs(tmp_path / "runs") if r.path == killed] == ["died"]
    assert main(argv) == 0
    after = list_runs(tmp_path / "runs")
    assert len(after) == 2 and all(r.status == "finished" for r in after)
    # a third point runs alone
    assert main(["sweep", str(path), "--grid", "lr=0.01,0.05,0.1", "-q"]) == 0
    assert len(list_runs(tmp_path / "runs")) == 3


def test_compare_iid(tmp_path: Path, capsys: pytest.CaptureFixture[str], one_thread: None) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, "runs_dir": str(tmp_path / "runs")}))
    assert main(["compare-iid", str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert "gap (iid - configured): final" in out
    names = sorted(r.name for r in list_runs(tmp_path / "runs"))
    assert names == ["tiny", "tiny-iid"]
    cfg = from_dict(TINY)
    assert iid_config(cfg).synthetic.iid
    assert describe_split(cfg) == "Synthetic(1.0, 1.0) users"  # not "iid": no partition
    assert describe_split(iid_config(cfg)) == "Synthetic-IID users"
    mnist = from_dict({**TINY, "dataset": "mnist", "partition": {"kind": "shards"}})
    assert iid_config(mnist).partition.kind == "iid"
    with pytest.raises(ConfigError, match="already 'iid'"):
        iid_config(from_dict({**TINY, "dataset": "mnist"}))
    # feature shift and label noise are heterogeneity too: the control drops them
    shifted = {"kind": "iid", "feature_shift": ["rotation", "invert"], "label_noise": 0.3}
    control = iid_config(from_dict({**TINY, "dataset": "mnist", "partition": shifted}))
    assert control.partition.kind == "iid" and control.partition.feature_shift == ()
    assert control.partition.label_noise == 0.0
    assert main(["compare-iid", str(path), "-q", "--set", "synthetic.iid=true"]) == 2


def test_a_point_over_other_data_is_not_reused(tmp_path: Path, one_thread: None) -> None:
    """The same config over data passed by the caller that changed since: another
    job, run again, not the old result shown for the new data."""
    from fedforge.data.federated import load_federated_data
    from fedforge.server.sweep import run_sweep

    cfg = from_dict({**TINY, "runs_dir": str(tmp_path)})
    data = load_federated_data(cfg)
    grid = [("lr", [0.01])]
    (first,) = run_sweep(cfg, grid, data_fn=lambda c: data)
    (again,) = run_sweep(cfg, grid, data_fn=lambda c: data)
    assert (first.status, again.status) == ("finished", "reused")
    other = load_federated_data(from_dict({**TINY, "seed": 3}))
    (fresh,) = run_sweep(cfg, grid, data_fn=lambda c: other)
    assert fresh.status == "finished" and fresh.run_dir != first.run_dir


def test_a_sweep_with_a_validation_split_chooses_on_it(tmp_path: Path, one_thread: None) -> None:
    """``evaluation.validation: 0.25``: each point's BEST, and the knee, are its
    best validation accuracy (the run store's validation rows, scored on the
    carved split), not its best test accuracy; FINAL stays the test set's."""
    from fedforge.server.sweep import chosen_on, format_sweep, run_sweep
    from fedforge.store import RunStore

    cfg = from_dict(
        {
            **TINY,
            "runs_dir": str(tmp_path / "runs"),
            "evaluation": {"validation": 0.25},
            "target_accuracy": None,
        }
    )
    results = run_sweep(cfg, [("lr", [0.01, 0.5, 2.0])])
    chosen = chosen_on(results)
    for r, c in zip(results, chosen, strict=True):
        assert r.run_dir is not None
        with RunStore.open(r.run_dir, read_only=True) as store:
            rows = store.read_rows("eval_metrics")
            tests = [x.test_accuracy for x in store.rounds() if x.test_accuracy is not None]
        validation = [v for _, name, v in rows if name == "validation_accuracy"]
        assert len(validation) == len(tests) == 2
        assert c == max(validation) and r.final_accuracy == tests[-1] and r.validated
    assert any(c != r.best_accuracy for r, c in zip(results, chosen, strict=True))
    table = format_sweep(results)
    assert "BEST (VALIDATION)" in table.splitlines()[0]
    for c, line in zip(chosen, table.splitlines()[1:], strict=True):
        assert c is not None and f"acc {100 * c:.2f}%" in line
    # a non-finite score is stored as NULL: the point is read without it
    import sqlite3

    from fedforge.server.sweep import point_config, run_point

    path = results[0].run_dir
    with sqlite3.connect(path / "store.sqlite") as conn:
        conn.execute("INSERT INTO eval_metrics VALUES (99, 'validation_accuracy', NULL)")
    again = run_point(point_config(cfg, {"lr": 0.01}), {"lr": 0.01}, None, False)
    assert again.status == "reused" and again.best_validation == chosen[0]


def test_validation_scores_stored_as_null_and_points_without_them() -> None:
    """A non-finite validation score is a NULL row: left out of the best, not a
    crash; a point of a sweep without validation rows is not compared by its
    test accuracy with the others' validation (no number, no knee from it)."""
    from fedforge.server.sweep import chosen_on

    with_val = [_point(1, 0.9), _point(2, 0.95), _point(3, 0.96)]
    with_val = [
        dataclasses.replace(p, best_validation=v)
        for p, v in zip(with_val, (0.5, 0.9, 0.92), strict=True)
    ]
    mixed = [*with_val, _point(4, 0.99)]
    assert chosen_on(mixed) == [0.5, 0.9, 0.92, None]
    # a split carved but no finite score at any point: no number, not the test's
    diverged = [dataclasses.replace(_point(1, 0.9), validated=True), _point(2, 0.95)]
    assert chosen_on(diverged) == [None, None] and knee(diverged) is None
    assert chosen_on([_point(1, 0.7), _point(2, 0.8)]) == [0.7, 0.8]
    assert knee(mixed) == knee(with_val) == 1
