"""A run as an MLflow run (``fedforge export RUN --mlflow TRACKING_URI``): the
series of export.py as metrics (step: the round number; timestamp: when the
round was recorded), the config as params, the summary's numbers as metrics
``summary/<name>`` at the last round, and the config and summary whole as
artifacts (``config.yaml``, ``summary.json``: params are cut at MLflow's length
limit, the artifacts keep everything). The MLflow run is named after the run
directory and tagged ``fedforge.run`` with it; a second export of the same run
into the same experiment is refused, not doubled (the tag is compared here, not
in an MLflow filter string, which cannot hold a name with both quotes).

Needs the ``mlflow`` extra (mlflow-skinny: tracking servers over http(s), and
``file:`` stores, which MLflow 3.7+ opens only with MLFLOW_ALLOW_FILE_STORE=true;
database URIs such as ``sqlite:///`` need the full ``mlflow`` package).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from fedforge.report.export import SUMMARY, ExportError, RunExport, needs_extra

RUN_TAG = "fedforge.run"
METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
PARAMS_PER_BATCH = 100
RUNS_PER_PAGE = 1000  # runs read per search while looking for an earlier export
PARAM_LENGTH = 500  # the shortest limit of MLflow's versions (6000 since 2.x servers)
# fedforge's run status: MLflow's (a running run's MLflow run stays RUNNING)
STATUS = {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}

T = TypeVar("T")


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _refusal(uri: str, exc: Exception) -> ExportError:
    """MLflow's error in one line, naming the tracking URI."""
    text = " ".join(str(exc).split())
    if "MLFLOW_ALLOW_FILE_STORE" in text:
        text = (
            "MLflow 3.7+ opens a file store only with MLFLOW_ALLOW_FILE_STORE=true in the "
            "environment; set it, or export to a tracking server (http://...)"
        )
    elif len(text) > 300:
        text = text[:297] + "..."
    return ExportError(f"the export to MLflow at {uri!r} failed: {text}")


def _exported(client: Any, experiment_id: str, name: str) -> str | None:
    """The MLflow run id of an earlier export of run ``name`` into the experiment
    (its ``fedforge.run`` tag), or None."""
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=RUNS_PER_PAGE, page_token=token)
        for found in page:
            if found.data.tags.get(RUN_TAG) == name:
                return str(found.info.run_id)
        token = page.token
        if not token:
            return None


def to_mlflow(run: RunExport, uri: str, experiment: str | None = None) -> str:
    """Log ``run`` to the MLflow tracking server or store at ``uri``, in
    ``experiment`` (made if absent; default: the run's config name). Returns
    the MLflow run id."""
    try:
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise needs_extra("mlflow", "MLflow", exc) from None
    name = experiment or str(run.params.get("name", "fedforge"))
    try:
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else client.create_experiment(name)
        done = _exported(client, experiment_id, run.name)
        if done is not None:
            raise ExportError(
                f"run {run.name} is already in MLflow experiment {name!r} at {uri!r} "
                f"(MLflow run {done}): delete it there to export again"
            )
        tags = {RUN_TAG: run.name, "fedforge.run_dir": str(run.path)}
        mlrun = client.create_run(experiment_id, run_name=run.name, tags=tags)
        run_id = mlrun.info.run_id
        metrics = [
            Metric(key, value, int(wall * 1000), step)
            for key, points in run.series.items()
            for step, value, wall in points
        ]
        last = max((p[2] for points in run.series.values() for p in points), default=0.0)
        metrics += [
            Metric(SUMMARY + key, value, int(last * 1000), run.last_step)
            for key, value in run.summary_numbers().items()
        ]
        for chunk in _batches(metrics, METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=list(chunk))
        params = [Param(k, _param_text(v)) for k, v in run.params.items()]
        for batch in _batches(params, PARAMS_PER_BATCH):
            client.log_batch(run_id, params=list(batch))
        client.log_text(run_id, run.config_yaml, "config.yaml")
        client.log_dict(run_id, run.summary, "summary.json")
        if run.status in STATUS:
            client.set_terminated(run_id, STATUS[run.status])
    except MlflowException as exc:
        raise _refusal(uri, exc) from None
    return str(run_id)


def _param_text(value: Any) -> str:
    """A param's text: strings as they are, the rest as JSON (true, 0.1)."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= PARAM_LENGTH else text[: PARAM_LENGTH - 3] + "..."
