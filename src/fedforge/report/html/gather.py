"""The run-wide figures of a report, read from the run store alone: who the run
is, accuracy and loss by round, time, bytes and compression, privacy spent,
the alerts fired, model versions, the config and the build record.

Every section is plain JSON-ready data (lists in columns, numbers or None; a
NaN or an infinity becomes None), which the page embeds as it is and the
figures are drawn from. Rounds are counted from 1, as ``fedforge show`` counts
them (the store's ``round_idx`` plus one).
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from fedforge.report.headline import headline
from fedforge.report.shown_config import ShownConfig
from fedforge.store.build_record import package_version, read_build
from fedforge.store.records import RoundRecord
from fedforge.store.runs_dir import live_status
from fedforge.store.runstore import RunStore
from fedforge.store.versions import list_versions
from fedforge.systems.summary import POPULATION_FILE, read_population

Data = dict[str, Any]
# a column of ``rounds`` the report plots when a store has it (a simulator of
# client timing would record each round's simulated clock there)
VIRTUAL_TIME = "virtual_time"


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (also inside lists and dicts) as None:
    what JSON can carry."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def identity(store: RunStore, cfg: ShownConfig, rounds: list[RoundRecord]) -> Data:
    """The run's name, settings and headline figures (one row of ``compare``'s table)."""
    info = store.info()
    head = headline(rounds, store.summary(), store.privacy())
    return finite(
        {
            "run_id": info.run_id,
            "name": info.name,
            "status": live_status(store.path, info.status),
            "created": info.created,
            "path": str(store.path),
            "algorithm": cfg.get("algorithm"),
            "mode": "deployment" if info.deployment else "sim",
            "score_name": info.score_name,  # what best/final_accuracy hold
            "client_fraction": cfg.get("client_fraction"),
            "local_epochs": cfg.get("local_epochs"),
            "batch_size": cfg.get("batch_size"),  # None: the whole local data set
            "num_clients": cfg.get("num_clients"),
            "rounds": head.rounds,
            "rounds_planned": cfg.get("rounds"),
            "best_accuracy": head.best_accuracy,
            "final_accuracy": head.final_accuracy,
            "rounds_to_best": head.rounds_to_best,
            "total_bytes": head.bytes_up + head.bytes_down,
            "bytes_up": head.bytes_up,
            "bytes_down": head.bytes_down,
            "wall_seconds": head.wall_seconds,
            "epsilon": head.epsilon,
            # the virtual clock's time to the target (a run with system profiles)
            "virtual_seconds_to_target": (store.summary() or {}).get("virtual_seconds_to_target"),
        }
    )


def progress(rounds: list[RoundRecord]) -> Data:
    """Test accuracy and loss (None in rounds not evaluated) and the cohort's mean
    train loss (None where no client reported one)."""
    return finite(
        {
            "round": [r.round_idx + 1 for r in rounds],
            "test_accuracy": [r.test_accuracy for r in rounds],
            "test_loss": [r.test_loss for r in rounds],
            "train_loss": [r.train_loss for r in rounds],
        }
    )


def timing(store: RunStore, rounds: list[RoundRecord]) -> Data:
    """Wall seconds per round and their running sum; the virtual clock's time at
    each round's end (the ``round_clock`` table of a run with system profiles, or
    a ``virtual_time`` column of the rounds table; else None)."""
    total, cumulative = 0.0, []
    for r in rounds:
        total += r.seconds
        cumulative.append(total)
    clock = store.round_clock()
    virtual = [(r, end) for r, _, _, end, *_ in clock] or store.round_column(VIRTUAL_TIME)
    return finite(
        {
            "round": [r.round_idx + 1 for r in rounds],
            "seconds": [r.seconds for r in rounds],
            "cumulative_seconds": cumulative,
            "virtual_time": None if virtual is None else [v for _, v in virtual],
            "population": read_population(store.path / POPULATION_FILE),
            "virtual_seconds_to_target": (store.summary() or {}).get("virtual_seconds_to_target"),
        }
    )


def _ratio(dense: int | None, sent: int) -> float | None:
    return None if dense is None or sent <= 0 else dense / sent


def traffic(rounds: list[RoundRecord]) -> Data:
    """Bytes each way per round, McMahan et al.'s estimate (``paper_bytes``), and
    the compression ratio each way: dense float32 bytes of the messages that
    travelled over the bytes sent (None for a round that recorded no float32
    figure, or sent nothing that way)."""
    up = [r.bytes_up for r in rounds]
    down = [r.bytes_down for r in rounds]
    dense_up = [r.float32_up for r in rounds]
    dense_down = [r.float32_down for r in rounds]
    recorded_up = [(d, s) for d, s in zip(dense_up, up, strict=True) if d is not None]
    recorded_down = [(d, s) for d, s in zip(dense_down, down, strict=True) if d is not None]
    return finite(
        {
            "round": [r.round_idx + 1 for r in rounds],
            "bytes_up": up,
            "bytes_down": down,
            "paper_bytes": [r.paper_bytes for r in rounds],
            "float32_up": dense_up,
            "float32_down": dense_down,
            "ratio_up": [_ratio(d, s) for d, s in zip(dense_up, up, strict=True)],
            "ratio_down": [_ratio(d, s) for d, s in zip(dense_down, down, strict=True)],
            "total_up": sum(up),
            "total_down": sum(down),
            # over the rounds that recorded their float32 bytes
            "overall_ratio_up": _ratio(
                sum(d for d, _ in recorded_up) if recorded_up else None,
                sum(s for _, s in recorded_up),
            ),
            "overall_ratio_down": _ratio(
                sum(d for d, _ in recorded_down) if recorded_down else None,
                sum(s for _, s in recorded_down),
            ),
        }
    )


def privacy(store: RunStore, cfg: ShownConfig) -> Data:
    """Epsilon at delta after each round (None: unbounded) and the budget,
    ``privacy.target_epsilon`` (None: no budget)."""
    rows = store.privacy()
    return finite(
        {
            "round": [r + 1 for r, _, _, _ in rows],
            "epsilon": [e for _, e, _, _ in rows],
            "delta": [d for _, _, d, _ in rows],
            "clip_norm": [c for _, _, _, c in rows],
            "budget": cfg.get("privacy.target_epsilon"),
            "dp": cfg.get("privacy.dp"),
        }
    )


def alerts(store: RunStore, cfg: ShownConfig) -> Data:
    """The alerts the run fired (rounds from 1), in order, and how many rules it
    watched."""
    rows = store.alerts()
    rules = cfg.get("alerts.rules")
    return finite(
        {
            "rules": len(rules) if isinstance(rules, list) else None,
            "round": [a.round_idx + 1 for a in rows],
            "rule": [a.rule for a in rows],
            "kind": [a.kind for a in rows],
            "client": [a.client_id for a in rows],
            "value": [a.value for a in rows],
            "threshold": [a.threshold for a in rows],
            "message": [a.message for a in rows],
            "outcome": [a.outcome for a in rows],
        }
    )


def _when(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix).astimezone().isoformat(timespec="seconds")


def versions(store: RunStore) -> Data:
    """The run's model versions (a deployment's), oldest first."""
    rows = list_versions(store)
    return finite(
        {
            "versions": [
                {
                    "version_id": v.version_id,
                    "parent_id": v.parent_id,
                    "round": v.round_idx + 1,
                    "created": _when(v.created),
                    "status": v.status,
                    "metrics": v.metrics,
                }
                for v in rows
            ]
        }
    )


def setup(store: RunStore, cfg: ShownConfig) -> Data:
    """The config as YAML (alert rules' secrets cut; as stored when this fedforge
    cannot rebuild it, with the sentence saying so), the run's summary, its
    build record (``build.json``: the model's size and layout, the data's
    fingerprint, and whatever else it records), and the versions of what wrote
    this report."""
    return finite(
        {
            "config_yaml": cfg.yaml,
            "config_note": cfg.note,
            "summary": store.summary(),
            "build": read_build(store.path),
            "report_written_by": {
                name: package_version(name) for name in ("fedforge", "plotly", "torch")
            },
        }
    )
