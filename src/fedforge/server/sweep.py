"""Sweeps and the IID control experiment.

``fedforge sweep CONFIG --grid local_epochs=1,5 --grid fedprox.mu=0,0.01`` runs every
point of the grid (the cartesian product, first key slowest) one after the
other, each as an ordinary run in ``runs_dir``, and prints one table: total
bytes, rounds, final and best accuracy, rounds to target. A point whose finished
run is already in ``runs_dir`` (same resolved config) is not run again; one
stopped with a checkpoint is resumed. So a sweep stopped at any point continues
where it was by running the same command again.

The knee (marked ``*``): over the points sorted by total bytes, the one farthest
above the chord from the cheapest to the most expensive point on the (bytes,
best accuracy) plane, both axes scaled to [0, 1] -- where more bytes stop buying
accuracy. None with fewer than three points, or when the bytes differ by 1% or
less (no trade-off) or the accuracies not at all.

With ``evaluation.validation`` on, settings are chosen on the validation split
(evaluation/validation.py), never on the test set: the BEST column and the knee
read each point's best validation accuracy, rounds to target its validation
curve (as the run's own target does), and FINAL is the test set's number.

``fedforge compare-iid CONFIG`` runs the config on an IID split (``partition.kind:
iid``; ``synthetic.iid: true`` for the Synthetic data set) and on its own split,
and prints the accuracy gap (IID minus configured): the seed's control experiment.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedforge.config import Config, override
from fedforge.config.parse import scalar
from fedforge.core.errors import ConfigError, StoreError
from fedforge.data.federated import FederatedData
from fedforge.evaluation.validation import VALIDATION_ACCURACY
from fedforge.tasks import load_task_data

DataFn = Callable[[Config], FederatedData | None]


@dataclass(frozen=True)
class PointResult:
    """One finished (or stopped) point of a sweep."""

    point: dict[str, Any]
    run_dir: Path | None
    status: str  # finished, failed (stopped), or reused
    rounds: int
    final_accuracy: float | None
    best_accuracy: float | None
    rounds_to_target: float | None
    total_bytes: int
    stopped: str | None = None  # a signal that came during the point (e.g. 'SIGINT')
    score_name: str = "accuracy"  # what final_accuracy and best_accuracy hold
    best_validation: float | None = None  # with evaluation.validation on
    validated: bool = False  # the run carved a validation split (evaluation.validation)


def on_validation(results: Sequence[PointResult]) -> bool:
    """Whether a sweep is chosen on validation: any of its points carved a split."""
    return any(r.validated or r.best_validation is not None for r in results)


def chosen_on(results: Sequence[PointResult]) -> list[float | None]:
    """What each point is chosen by: its best validation accuracy when any point
    of the sweep carved a validation split (None for a point without a finite
    one: never its test accuracy in its place), else its best test accuracy."""
    if on_validation(results):
        return [r.best_validation for r in results]
    return [r.best_accuracy for r in results]


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[Any]]]:
    """``["key=v1,v2", ...]`` as (key, values); each value read as YAML."""
    grid = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise ConfigError(f"grid {item!r} must look like key=v1,v2 (e.g. local_epochs=1,5)")
        grid.append((key.strip(), [scalar(v) for v in text.split(",")]))
    keys = [k for k, _ in grid]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"grid keys {keys} repeat a key")
    return grid


def grid_points(grid: Sequence[tuple[str, Sequence[Any]]]) -> list[dict[str, Any]]:
    """The cartesian product, first key slowest."""
    keys = [k for k, _ in grid]
    return [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in grid))
    ]


def point_config(cfg: Config, point: dict[str, Any]) -> Config:
    """``cfg`` with the point's values, named after them (e.g. ``run-local_epochs=5``)."""
    tag = "-".join(f"{k}={v}" for k, v in point.items()).replace("/", "_")
    return override(cfg, {**point, "name": f"{cfg.name}-{tag}" if tag else cfg.name})


def _same(a: Config, b: Config) -> bool:
    """The same job, wherever its data is read from, however its runs directory is
    spelled (the run was found in it), and whether its noise is seed-derived by
    default (``privacy.secret_noise`` null) or by choice (false)."""
    where = {"data_dir": None, "runs_dir": "runs"}

    def job(c: Config) -> Config:
        return override(c, {**where, "privacy.secret_noise": c.privacy.noise_is_secret})

    return job(a) == job(b)


def _existing(cfg: Config) -> tuple[Path | None, str | None]:
    """The newest run of ``cfg`` in its runs_dir, and its status."""
    from fedforge.store import RunStore, list_runs

    runs_dir = Path(cfg.runs_dir)
    if not runs_dir.is_dir():
        return None, None
    for info in sorted(list_runs(runs_dir), key=lambda r: r.created, reverse=True):
        if info.name == cfg.name and info.status == "damaged":  # e.g. its final parameters
            print(
                f"fedforge: sweep: run {info.run_id} of point {cfg.name} is damaged "
                "(fedforge show says how); the point runs again",
                file=sys.stderr,
                flush=True,
            )
        if info.name != cfg.name or info.status in ("unreadable", "damaged"):
            continue
        with RunStore.open(info.path, read_only=True) as store:
            try:
                stored = store.config()
            except StoreError:  # e.g. written by a version with other fields: not this job
                continue
            if _same(stored, cfg):
                return info.path, info.status
    return None, None


def _result(
    point: dict[str, Any], run_dir: Path, status: str, stopped: str | None = None
) -> PointResult:
    from fedforge.store import RunStore

    with RunStore.open(run_dir, read_only=True) as store:
        rounds = store.rounds()
        summary = store.summary() or {}
        score_name, _ = store.score_and_engine()
        rows = store.read_rows("eval_metrics")
        try:
            validated = store.config().evaluation.validation > 0
        except StoreError:  # written by a version with other fields: read its rows alone
            validated = False
    # a non-finite score is stored as NULL (e.g. a diverged regression's R^2)
    validation = [v for _, name, v in rows if name == VALIDATION_ACCURACY and v is not None]
    evaluated = [r.test_accuracy for r in rounds if r.test_accuracy is not None]
    return PointResult(
        point,
        run_dir,
        status,
        len(rounds),
        evaluated[-1] if evaluated else None,
        max(evaluated) if evaluated else None,
        summary.get("rounds_to_target"),
        sum(r.bytes_up + r.bytes_down for r in rounds),
        stopped,
        score_name,
        max(validation) if validation else None,
        validated,
    )


def run_point(
    cfg: Config, point: dict[str, Any], data: FederatedData | None, progress: bool
) -> PointResult:
    """Run one point, or reuse its finished run, or resume its stopped one."""
    from fedforge.server.experiment import fingerprint_of
    from fedforge.server.loop import resume, run
    from fedforge.store.build_record import same_build

    path, status = _existing(cfg)
    if path is not None:  # the same config over other data is another job
        data = data if data is not None else load_task_data(cfg)
        if not same_build(path, fingerprint_of(data), cfg):
            path = None
    if path is not None and status == "finished":
        return _result(point, path, "reused")
    if path is not None:  # stopped or killed, with a checkpoint or before its first
        result = resume(path, data=data, progress=progress)
    else:
        result = run(cfg, data=data, progress=progress)
    assert result.run_dir is not None
    status = "failed" if result.stopped else "finished"
    return _result(point, result.run_dir, status, result.stopped or result.signalled)


def run_sweep(
    cfg: Config,
    grid: Sequence[tuple[str, Sequence[Any]]],
    data_fn: DataFn | None = None,
    progress: bool = False,
    echo: Callable[[str], None] | None = None,
    into: list[PointResult] | None = None,
) -> list[PointResult]:
    """Every point of ``grid`` in sequence (``data_fn``: the data of a point's
    config, None to load it); stops after a point a signal came to (stopped, or
    finished in the round it came). Each result is appended to ``into`` as it
    comes, so a caller still has the finished points when a later one fails."""
    points = grid_points(grid)
    configs = [point_config(cfg, p) for p in points]  # every point validated up front
    _refuse_repeats(points, configs)
    results = into if into is not None else []
    for k, (point, pcfg) in enumerate(zip(points, configs, strict=True)):
        if echo is not None:
            echo(f"sweep: point {k + 1}/{len(points)}: {pcfg.name}")
        res = run_point(pcfg, point, data_fn(pcfg) if data_fn else None, progress)
        results.append(res)
        if res.stopped is not None:
            break
    return results


def _refuse_repeats(points: Sequence[dict[str, Any]], configs: Sequence[Config]) -> None:
    """Two points that resolve to the same run (a config forcing a field, e.g.
    fedsgd's E = 1 and B = all) would run it twice under labels that never ran."""
    seen: list[tuple[Config, dict[str, Any]]] = []
    for point, pcfg in zip(points, configs, strict=True):
        key = override(pcfg, {"name": "point"})  # the names differ; nothing else may
        twin = next((p for c, p in seen if c == key), None)
        if twin is not None:
            raise ConfigError(
                f"grid points {twin} and {point} are the same run once the config is "
                "resolved (e.g. algorithm fedsgd forces local_epochs = 1 and batch_size = "
                "null, perfedavg local_epochs = 1); sweep such values separately"
            )
        seen.append((key, point))


def knee(results: Sequence[PointResult]) -> int | None:
    """The index (into ``results``) of the knee, see the module docstring."""
    pts = sorted(
        (r.total_bytes, c, i)
        for i, (r, c) in enumerate(zip(results, chosen_on(results), strict=True))
        if c is not None
    )
    if len(pts) < 3:
        return None
    accs = [a for _, a, _ in pts]
    b0, a0, b1, a1 = pts[0][0], pts[0][1], pts[-1][0], pts[-1][1]
    # no trade-off to find a knee in: the bytes differ by less than 1% (e.g. only
    # the header digits of the loss), or the accuracies not at all
    if b1 - b0 <= 0.01 * b1 or max(accs) == min(accs):
        return None
    span_b, span_a = b1 - b0, max(accs) - min(accs)
    best, where = 0.0, None
    for b, a, i in pts[1:-1]:
        x, y = (b - b0) / span_b, (a - a0) / span_a
        above = y - (a1 - a0) / span_a * x  # height above the chord
        if above > best:
            best, where = above, i
    return where


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_sweep(results: Sequence[PointResult]) -> str:
    """One table: a row per point, the knee marked with ``*``."""
    from fedforge.report.progress import format_bytes, named_score

    if not results:
        return "no points"
    keys = list(results[0].point)
    at = knee(results)
    chosen = chosen_on(results)
    best = "BEST (VALIDATION)" if on_validation(results) else "BEST"
    head = [*keys, "ROUNDS", "FINAL", best, "TO TARGET", "BYTES", "RUN", ""]
    rows = [head]
    for i, r in enumerate(results):
        rows.append(
            [
                *(str(r.point[k]) for k in keys),
                str(r.rounds),
                named_score(r.final_accuracy, r.score_name),
                named_score(chosen[i], r.score_name),
                _fmt(r.rounds_to_target, ".1f"),
                format_bytes(r.total_bytes),
                r.run_dir.name if r.run_dir else "-",
                ("* knee" if i == at else "") + (" (stopped)" if r.status == "failed" else ""),
            ]
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    lines = ("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def iid_config(cfg: Config) -> Config:
    """``cfg`` on an IID split of the same data, named ``<name>-iid``: the labels
    split IID, and no feature shift or label noise (every client alike)."""
    if cfg.dataset == "synthetic":
        if cfg.synthetic.iid:
            raise ConfigError("synthetic.iid is already true: there is no split to compare")
        return override(cfg, {"synthetic.iid": True, "name": f"{cfg.name}-iid"})
    part = cfg.partition
    if part.kind == "iid" and not part.feature_shift and not part.label_noise:
        raise ConfigError(
            "partition.kind is already 'iid', without feature shift or label noise: "
            "there is no split to compare"
        )
    iid = {"partition.kind": "iid", "partition.feature_shift": [], "partition.label_noise": 0.0}
    return override(cfg, {**iid, "name": f"{cfg.name}-iid"})


def compare_iid(
    cfg: Config, data_fn: DataFn | None = None, progress: bool = False
) -> tuple[PointResult, PointResult | None]:
    """(IID, configured) runs of ``cfg``, each reused or resumed like a sweep point;
    the configured one is None when a signal came during the IID run."""
    iid = iid_config(cfg)
    first = run_point(iid, {"split": "iid"}, data_fn(iid) if data_fn else None, progress)
    if first.stopped is not None:
        return first, None
    own = run_point(cfg, {"split": "configured"}, data_fn(cfg) if data_fn else None, progress)
    return first, own


def format_compare(iid: PointResult, own: PointResult | None) -> str:
    """The two runs and the accuracy gap (IID minus configured); no gap when either
    was stopped, or the configured one never ran."""

    def gap(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None else f"{a - b:+.4f}"

    if own is None:
        return f"{format_sweep([iid])}\nthe configured run did not start: stopped by {iid.stopped}"
    table = format_sweep([iid, own])
    if "failed" in (iid.status, own.status):
        return f"{table}\nno gap: a run was stopped before its end"
    return (
        f"{table}\n"
        f"gap (iid - configured): final {gap(iid.final_accuracy, own.final_accuracy)}, "
        f"best {gap(iid.best_accuracy, own.best_accuracy)}"
    )
