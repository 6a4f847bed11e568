"""The ``fedforge alerts`` and ``fedforge export`` commands: a run's recorded
alerts as a table, and its rounds, config and summary written for TensorBoard
or MLflow (export.py, export_mlflow.py). Both read the run store read-only, so
they work on a finished run and on one still running."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fedforge.core.errors import ConfigError
from fedforge.report.run_args import add_run_lookup, open_run

if TYPE_CHECKING:
    from fedforge.store.records import AlertRecord


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``alerts`` and ``export`` subcommands."""
    alerts = sub.add_parser("alerts", help="print the alerts a run fired (config: alerts)")
    add_run_lookup(alerts)
    export = sub.add_parser(
        "export", help="write a run's rounds, config and summary for TensorBoard or MLflow"
    )
    add_run_lookup(export)
    export.add_argument(
        "--tensorboard",
        type=Path,
        metavar="DIR",
        help="write event files in DIR/<run> (needs the 'tensorboard' extra)",
    )
    export.add_argument(
        "--mlflow",
        metavar="TRACKING_URI",
        help="log an MLflow run at TRACKING_URI, e.g. http://host:5000 or file:./mlruns "
        "(needs the 'mlflow' extra)",
    )
    export.add_argument(
        "--experiment", metavar="NAME", help="the MLflow experiment (default: the config name)"
    )


def format_alerts(alerts: list[AlertRecord]) -> str:
    """The table of ``fedforge alerts``: one line per alert, rounds counted from 1."""
    if not alerts:
        return "no alerts"
    rows = [("ROUND", "RULE", "KIND", "MESSAGE", "OUTCOME")]
    rows += [(str(a.round_idx + 1), a.rule, a.kind, a.message, a.outcome) for a in alerts]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def cmd_alerts(args: argparse.Namespace) -> int:
    with open_run(args) as store:
        print(format_alerts(store.alerts()))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.tensorboard is None and args.mlflow is None:
        raise ConfigError("export needs a destination: --tensorboard DIR and/or --mlflow URI")
    if args.experiment is not None and args.mlflow is None:
        raise ConfigError("--experiment names an MLflow experiment: give --mlflow too")
    from fedforge.report.export import gather, to_tensorboard

    with open_run(args) as store:
        run = gather(store)
    if run.config_note is not None:
        print(f"fedforge: {run.config_note}", file=sys.stderr)
    if args.tensorboard is not None:
        folder = to_tensorboard(run, args.tensorboard)
        print(f"tensorboard: {run.name} written to {folder} (tensorboard --logdir {folder.parent})")
    if args.mlflow is not None:
        from fedforge.report.export_mlflow import to_mlflow

        run_id = to_mlflow(run, args.mlflow, args.experiment)
        print(f"mlflow: {run.name} logged to {args.mlflow} as run {run_id}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "alerts": cmd_alerts,
    "export": cmd_export,
}
