"""The run's note on the relative norm bound (``robust.max_norm_multiple``) where a
server step takes few updates of label-skewed clients (config/notes.py)."""

from __future__ import annotations

from pathlib import Path

from fedforge.config import load, override
from fedforge.config.notes import config_notes


def test_the_norm_gate_over_few_updates_of_label_skewed_clients_is_named() -> None:
    """McMahan's CNN on pathological shards at one client a round was stopped by
    the default relative norm bound (benchmarks/results/table1/
    cnn_noniid_c0_gate_stop.txt): such a run says so and what to set; a cohort of
    ten, IID clients, or the bound off say nothing of it."""
    configs = Path(__file__).resolve().parents[1] / "configs"
    shards = load(configs / "cnn_noniid_e1_b10.yaml")
    assert shards.partition.kind == "shards" and shards.num_clients == 100

    def gate_notes(**fields: object) -> list[str]:
        notes = config_notes(override(shards, fields))
        return [n for n in notes if n.startswith("robust.max_norm_multiple")]

    (note,) = gate_notes(client_fraction=0.01)
    assert note.startswith("robust.max_norm_multiple = 10 judges each update against the ")
    assert "last 5 server steps, 1 a step" in note and "partition.kind 'shards'" in note
    assert "stop the run (robust.max_refused_fraction)" in note
    assert "set robust.max_norm_multiple: null" in note
    (four,) = gate_notes(client_fraction=0.04, **{"robust.norm_window": 3})
    assert "last 3 server steps, 4 a step" in four
    (endless,) = gate_notes(client_fraction=0.01, **{"robust.max_refused_fraction": None})
    assert "stop the run" not in endless
    assert gate_notes(client_fraction=0.05) == []
    assert gate_notes(client_fraction=0.01, **{"partition.kind": "iid"}) == []
    assert gate_notes(client_fraction=0.01, **{"robust.max_norm_multiple": None}) == []
    # the partition splits no data: synthetic data, or data with its own split
    assert gate_notes(client_fraction=0.01, dataset="synthetic", model="logreg") == []
    few = override(shards, {"client_fraction": 0.01})
    assert not any(n.startswith("robust.max") for n in config_notes(few, own_split=True))
