"""configs/recommended.yaml: it loads with the config parser, every recommended
value names the docs/results.md row it comes from, its learning rate is the one
Table 2's grid recorded best, and it runs a round."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fedforge.config import load, override
from fedforge.data.federated import load_federated_data
from fedforge.server.loop import run

ROOT = Path(__file__).resolve().parents[1]
PATH = ROOT / "configs" / "recommended.yaml"
# the settings a new federation starts from, each with its source
RECOMMENDED = (
    "local_epochs",
    "batch_size",
    "lr",
    "lr_decay",
    "client_fraction",
    "fedprox",
    "communication",
    "robust",
)


def comment_above(lines: list[str], key: str) -> str:
    """The comment lines just above ``key:``'s line."""
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
    above = []
    for line in reversed(lines[:at]):
        if not line.startswith("#"):
            break
        above.append(line)
    return " ".join(reversed(above))


def test_every_recommended_value_names_a_results_row() -> None:
    lines = PATH.read_text().splitlines()
    rows = (ROOT / "docs" / "results.md").read_text()
    scripts = set(re.findall(r"^\| `([a-z0-9_]+\.py)`", rows, flags=re.M))
    for key in RECOMMENDED:
        comment = comment_above(lines, key)
        named = re.findall(r"results\.md: `([a-z0-9_]+\.py)`", comment)
        assert named, f"{key}: no 'results.md: `script.py`' in its comment"
        for script in named:
            assert script in scripts, f"{key}: {script} has no row in docs/results.md"
            assert (ROOT / "benchmarks" / script).is_file(), script
        assert "NOTE" not in comment, f"{key}: a placeholder left in its comment"


def test_recommended_lr_is_table2s_recorded_best() -> None:
    """The lr is the best grid point of Table 2's gridded rows at the recommended
    batch size (each saved point read back from benchmarks/results/table2; at
    larger batches, fewer steps an epoch, a larger lr can win)."""
    points: dict[str, list[dict]] = {}
    for path in (ROOT / "benchmarks" / "results" / "table2").glob("*__lr*.json"):
        point = json.loads(path.read_text())
        points.setdefault(point["row"], []).append(point)
    batch = f"_b{load(PATH).batch_size}"
    gridded = {
        row: p
        for row, p in points.items()
        if len(p) >= 2 and row[:3] in ("2nn", "cnn") and row.endswith(batch)
    }
    assert gridded
    for row, grid in gridded.items():
        reached = [p for p in grid if p["rounds_to_target"] is not None]
        best = min(reached, key=lambda p: p["rounds_to_target"])
        assert best["lr"] == load(PATH).lr, row


def test_recommended_config_runs_a_round(mnist_dir: Path, tmp_path: Path) -> None:
    cfg = override(
        load(PATH),
        {
            "num_clients": 10,
            "local_epochs": 1,
            "rounds": 1,
            "evaluation.every": 1,
            "data_dir": str(mnist_dir),
            "runs_dir": str(tmp_path),
            "workers": 1,
            "threads": 1,
        },
    )
    result = run(cfg, data=load_federated_data(cfg), progress=False)
    assert result.summary["rounds_done"] == 1
    # one client's epoch on two digits' shards: above chance, far from the target
    assert 0.1 < result.summary["best_accuracy"] < cfg.target_accuracy
