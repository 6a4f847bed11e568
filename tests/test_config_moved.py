"""Fields moved from the top level into their component's section (config/
moved.py): the old spelling is still read from a YAML file, a ``--set``
override, ``Config(...)`` and the config a run stored before the move, each
time with one line naming the new spelling; both spellings disagreeing are
refused in one line; the new sections' ranges are refused in one line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tests.test_resume import SMALL, _crashed_run

from fedforge import resume, run
from fedforge.config import (
    AggregationConfig,
    Config,
    EvaluationConfig,
    FedProxConfig,
    PersonalEvalConfig,
    ServerOptimizerConfig,
    from_dict,
    load,
    override,
    to_dict,
)
from fedforge.config.notes import config_notes
from fedforge.core.errors import ConfigError
from fedforge.report.shown_config import shown_config
from fedforge.store import RunStore

# old spelling -> (its value away from the default, the same config in the new spelling)
OLD: dict[str, tuple[Any, dict[str, Any]]] = {
    "mu": (0.3, {"fedprox": {"mu": 0.3}}),
    "server_lr": (0.5, {"server_optimizer": {"lr": 0.5}}),
    "aggregation_weights": ("sqrt", {"aggregation": {"weights": "sqrt"}}),
    "weight_cap": (40, {"aggregation": {"weight_cap": 40}}),
    "quality_temperature": (2.0, {"aggregation": {"quality_temperature": 2.0}}),
    "quality_holdout": (0.3, {"aggregation": {"quality_holdout": 0.3}}),
    "eval_every": (3, {"evaluation": {"every": 3}}),
    "eval_initial": (True, {"evaluation": {"initial": True}}),
    "eval_clients": (True, {"evaluation": {"clients": True}}),
    "eval_holdout": (0.4, {"evaluation": {"holdout": 0.4}}),
    "eval_batch_size": (64, {"evaluation": {"batch_size": 64}}),
    "metrics": (["accuracy"], {"evaluation": {"metrics": ["accuracy"]}}),
    "client_tags": ("tags.csv", {"evaluation": {"client_tags": "tags.csv"}}),
    "personal_eval": ({"steps": 2}, {"evaluation": {"personal": {"steps": 2}}}),
}
NEW = {
    "mu": "fedprox.mu",
    "server_lr": "server_optimizer.lr",
    "aggregation_weights": "aggregation.weights",
    "weight_cap": "aggregation.weight_cap",
    "quality_temperature": "aggregation.quality_temperature",
    "quality_holdout": "aggregation.quality_holdout",
    "eval_every": "evaluation.every",
    "eval_initial": "evaluation.initial",
    "eval_clients": "evaluation.clients",
    "eval_holdout": "evaluation.holdout",
    "eval_batch_size": "evaluation.batch_size",
    "metrics": "evaluation.metrics",
    "client_tags": "evaluation.client_tags",
    "personal_eval": "evaluation.personal",
}
# what a field needs to be read at all (personal evaluation and groups: clients scored)
NEEDS: dict[str, dict[str, Any]] = {
    "client_tags": {"evaluation": {"clients": True}},
    "personal_eval": {"evaluation": {"clients": True}},
}


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def _moved_note(cfg: Config) -> str:
    (note,) = [n for n in config_notes(cfg) if "still read" in n]
    return note


@pytest.mark.parametrize("old", sorted(OLD))
def test_each_old_spelling_in_a_file_is_read_as_the_new_one(tmp_path: Path, old: str) -> None:
    value, new = OLD[old]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(_merged({old: value}, NEEDS.get(old, {}))))
    got = load(path)
    assert got == from_dict(_merged(new, NEEDS.get(old, {})))
    assert got != Config()
    assert _moved_note(got) == f"{old} is now {NEW[old]} (the old spelling is still read)"
    assert to_dict(got) == to_dict(from_dict(_merged(new, NEEDS.get(old, {}))))  # stored new


def test_the_note_names_every_old_spelling_in_one_line() -> None:
    cfg = from_dict({"mu": 0.3, "eval_every": 2, "server_lr": 0.5})
    assert _moved_note(cfg) == (
        "mu is now fedprox.mu, server_lr is now server_optimizer.lr, eval_every is now "
        "evaluation.every (the old spellings are still read)"
    )
    assert [n for n in config_notes(from_dict({"fedprox": {"mu": 0.3}})) if "still" in n] == []


def test_an_override_in_either_spelling_replaces_the_field(tmp_path: Path) -> None:
    new = tmp_path / "new.yaml"
    new.write_text("fedprox: {mu: 0.1}\nevaluation: {every: 4, clients: true}\n")
    cfg = load(new, {"mu": 0.2, "eval_every": 2})  # --set mu=0.2 --set eval_every=2
    assert cfg.fedprox == FedProxConfig(mu=0.2)
    assert cfg.evaluation == EvaluationConfig(every=2, clients=True)  # the rest kept
    assert "mu is now fedprox.mu" in _moved_note(cfg)
    old = tmp_path / "old.yaml"
    old.write_text("mu: 0.1\npersonal_eval: {steps: 3, lr: 0.2}\neval_clients: true\n")
    cfg = load(old, {"fedprox.mu": 0.4, "evaluation.personal.steps": 1})
    assert cfg.fedprox.mu == 0.4
    assert cfg.evaluation.personal == PersonalEvalConfig(steps=1, lr=0.2)
    cfg = load(old, {"personal_eval.lr": 0.5})
    assert cfg.evaluation.personal == PersonalEvalConfig(steps=3, lr=0.5)


def test_config_takes_the_old_spelling() -> None:
    cfg = Config(**{"mu": 0.3, "eval_every": 5, "server_lr": 0.5})
    assert cfg == Config(
        fedprox=FedProxConfig(mu=0.3),
        evaluation=EvaluationConfig(every=5),
        server_optimizer=ServerOptimizerConfig(lr=0.5),
    )
    assert "mu is now fedprox.mu" in _moved_note(cfg)
    kept = override(cfg, {"name": "other"})  # a derived copy says it too
    assert kept.fedprox.mu == 0.3 and _moved_note(kept) == _moved_note(cfg)
    # into the section given: personal evaluation without clients scored refused as ever
    agg = Config(**{"weight_cap": 7, "aggregation": AggregationConfig(weights="capped")})
    assert agg.aggregation == AggregationConfig(weights="capped", weight_cap=7)
    with pytest.raises(ConfigError, match="'evaluation.personal.steps' = 1 .*evaluation.clients"):
        Config(**{"personal_eval": PersonalEvalConfig(steps=1)})


@pytest.mark.parametrize(
    ("data", "old", "new"),
    [
        ({"mu": 0.1, "fedprox": {"mu": 0.2}}, "'mu' = 0.1", "'fedprox.mu' = 0.2"),
        (
            {"eval_every": 2, "evaluation": {"every": 3, "clients": True}},
            "'eval_every' = 2",
            "'evaluation.every' = 3",
        ),
        (
            {"personal_eval": {"steps": 1}, "evaluation": {"personal": {"steps": 2}}},
            "'personal_eval.steps' = 1",
            "'evaluation.personal.steps' = 2",
        ),
    ],
)
def test_both_spellings_disagreeing_are_refused_in_one_line(
    data: dict[str, Any], old: str, new: str
) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"config fields {old} and {new} disagree: ")
    assert text.endswith("give only '" + new.split("'")[1] + "'")


def test_both_spellings_agreeing_are_one_setting() -> None:
    cfg = from_dict({"mu": 0.2, "fedprox": {"mu": 0.2}, "eval_clients": True})
    assert cfg.fedprox.mu == 0.2 and cfg.evaluation.clients
    with pytest.raises(ConfigError, match="config fields 'mu' = 0.1 and 'fedprox.mu' = 0.2"):
        Config(**{"mu": 0.1, "fedprox": FedProxConfig(mu=0.2)})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"fedprox": {"mu": -1}},
            "config field 'fedprox.mu' = -1.0 is invalid: must be >= 0 (FedProx's proximal "
            "coefficient; lr * mu below 3.4e38 in a float32 run)",
        ),
        (
            {"aggregation": {"quality_holdout": 1}},
            "config field 'aggregation.quality_holdout' = 1.0 is invalid: must be in (0, 1) "
            "(each client's validation split)",
        ),
        (
            {"aggregation": {"weights": "capped"}},
            "config field 'aggregation.weight_cap' = None is invalid: must be an integer >= 1 "
            "(and is needed by aggregation.weights = 'capped')",
        ),
        (
            {"aggregation": {"weights": "loss"}},
            "config field 'aggregation.weights' = 'loss' is invalid: must be one of "
            "'num_examples', 'uniform', 'sqrt', 'capped', 'quality', 'class'",
        ),
        (
            {"evaluation": {"every": 0}},
            "config field 'evaluation.every' = 0 is invalid: must be an integer >= 1",
        ),
        (
            {"evaluation": {"holdout": 1.5}},
            "config field 'evaluation.holdout' = 1.5 is invalid: must be in (0, 1)",
        ),
        (
            {"evaluation": {"batch_size": 0}},
            "config field 'evaluation.batch_size' = 0 is invalid: must be an integer >= 1",
        ),
        (
            {"server_optimizer": {"lr": 0}},
            "config field 'server_optimizer.lr' = 0.0 is invalid: must be a number > 0 "
            "(below 3.4e38 in a float32 run)",
        ),
        (  # an old spelling is refused by its new name
            {"eval_every": 0},
            "config field 'evaluation.every' = 0 is invalid: must be an integer >= 1",
        ),
    ],
)
def test_the_new_sections_ranges_are_refused_in_one_line(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    assert str(err.value) == message


# the run below in the new spelling, and as a run made before the move stored it
RUN_NEW = {
    **SMALL,
    "algorithm": "fedprox",
    "fedprox": {"mu": 0.3},
    "server_optimizer": {"lr": 0.5},
    "aggregation": {"weights": "sqrt"},
    "evaluation": {"every": 2, "clients": True, "holdout": 0.25},
    "checkpoint_every": 1,
}
OLD_KEYS = {"mu": 0.3, "server_lr": 0.5, "aggregation_weights": "sqrt", "eval_every": 2}
OLD_KEYS |= {"eval_clients": True, "eval_holdout": 0.25, "eval_batch_size": 250}
OLD_KEYS |= {"eval_initial": False, "weight_cap": None, "quality_temperature": 1.0}
OLD_KEYS |= {"quality_holdout": 0.1, "client_tags": None, "metrics": []}
OLD_KEYS |= {"personal_eval": {"steps": 0, "lr": None}}


def _stored_the_old_way(run_dir: Path) -> dict[str, Any]:
    """Rewrite ``run_dir``'s stored config (database and config.yaml) with the
    top-level fields an older fedforge wrote; the sections they moved to removed."""
    db = run_dir / "store.sqlite"
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT config_json FROM runs").fetchone()
        data = json.loads(text)
        for section in ("fedprox", "aggregation", "evaluation"):
            del data[section]
        del data["server_optimizer"]["lr"]
        data |= OLD_KEYS
        conn.execute("UPDATE runs SET config_json = ?", (json.dumps(data),))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return data


def test_a_run_stored_with_the_old_keys_resumes_and_reports(
    make_data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A run made before the move (its stored config in the old spelling), killed
    in round 3 of 4, resumes to the uninterrupted run's parameters and rounds bit
    for bit, says the new spelling once, and its config is shown in it."""
    data = make_data([7, 12, 5, 9], dtype=torch.float64)
    want = run(from_dict({**RUN_NEW, "runs_dir": str(tmp_path / "a")}), data)
    crashed = {**RUN_NEW, "runs_dir": str(tmp_path / "b")}
    run_dir = _crashed_run(monkeypatch, crashed, data, 2)
    stored = _stored_the_old_way(run_dir)
    with RunStore.open(run_dir, read_only=True) as store:
        assert len(store.rounds()) == 2 and store.status == "failed"
        assert store.config() == from_dict(crashed)  # read as the new spelling
        shown = shown_config(store)
    assert shown.problem is None and shown.get("fedprox.mu") == 0.3
    assert shown.get("evaluation.every") == 2 and shown.get("mu") is None
    capsys.readouterr()
    got = resume(run_dir, data=data)
    err = capsys.readouterr().err
    assert torch.equal(got.params, want.params)
    assert [r.test_loss for r in got.rounds] == [r.test_loss for r in want.rounds]
    assert [r.test_accuracy for r in got.rounds] == [r.test_accuracy for r in want.rounds]
    assert err.count("mu is now fedprox.mu") == 1  # one line, with every old name
    assert "eval_every is now evaluation.every" in err and "differs from" not in err
    with RunStore.open(run_dir, read_only=True) as store:
        assert store.status == "finished" and store.config_data() == stored
