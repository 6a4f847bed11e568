"""Small real runs that the report and compare tests read (made once a session,
by conftest's ``report_runs``):
one with per-client evaluation, drift diagnostics and refused uploads, its name
holding markup; one under central DP with a budget."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.conftest import _make_data

from fedforge.config import from_dict
from fedforge.server.loop import run

# a run name is a folder name: no '/', so no closing tag; the markup must still
# reach the page as text
HOSTILE_NAME = "rep<b>x<script>alert(1)"
BASE = {
    "model": "2nn",
    "num_clients": 6,
    "client_fraction": 0.5,
    "local_epochs": 1,
    "batch_size": 8,
    "lr": 0.05,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


def make_report_runs(root: Path) -> dict[str, Path]:
    """{'robust': run dir, 'dp': run dir}, both in ``root/runs``."""
    runs = root / "runs"
    data = _make_data([30, 12, 41, 25, 7, 33], num_test=40)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDFORGE_THREADS", "1")
        try:
            robust = run(
                from_dict(
                    {
                        **BASE,
                        "name": HOSTILE_NAME,
                        "rounds": 4,
                        "runs_dir": str(runs),
                        "eval_clients": True,
                        "robust": {
                            "attack": "nan_inf",
                            "attack_fraction": 0.34,
                            "max_refused_fraction": None,
                        },
                    }
                ),
                data,
            )
            dp = run(
                from_dict(
                    {
                        **BASE,
                        "name": "rep-dp",
                        "rounds": 3,
                        "runs_dir": str(runs),
                        "eval_every": 1,
                        "privacy": {
                            "dp": "central",
                            "noise_multiplier": 3.0,
                            "delta": 1e-3,
                            "target_epsilon": 3.0,
                        },
                    }
                ),
                data,
            )
        finally:
            torch.set_num_threads(before)
    assert robust.run_dir is not None and dp.run_dir is not None
    return {"robust": robust.run_dir, "dp": dp.run_dir}
