"""The ``fedforge`` command: run, resume, runs, show, report, compare, sweep,
compare-iid, dashboard, alerts, export; server, client, certs, keys, models,
profile (a deployment).

A user's mistake (bad config value, missing data, unknown run) ends in one line
naming the value and what is allowed, with exit status 2; never a traceback.
A run stopped by SIGINT/SIGTERM checkpoints, says how to resume, and exits with
128 + the signal number (130, 143). A command whose optional dependencies are not
installed names the extra that installs them (``pip install 'fedforge[deploy]'``).

The arguments are parsed before anything heavy loads: this module and the parser's
builders import no torch, numpy or gRPC, so ``--help``, ``--version`` and argument
errors answer at once; each command's handler imports what it needs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedforge import __version__
from fedforge.core.errors import ConfigError, FedforgeError, StopNow
from fedforge.core.extras import extra_of, installed
from fedforge.core.registry import load_plugins
from fedforge.core.startup import load_torch
from fedforge.report import observe_cli, profile_cli
from fedforge.report.dashboard import command as dashboard
from fedforge.report.run_args import add_run_lookup, open_run
from fedforge.server import audit_cli
from fedforge.transport import certs_cli

if TYPE_CHECKING:
    from fedforge.config import Config
    from fedforge.server.loop import RunResult

EXIT_USER_ERROR = 2

# What each command always needs beyond the core, looked for before it starts (so a
# missing extra is named before any config is read); a need met only on some paths
# (export's libraries, Parquet tables) is named where it is met.
NEEDS = {
    "server": ("grpc", "grpc_health", "google.protobuf", "prometheus_client"),
    "client": ("grpc", "google.protobuf"),
    "report": ("plotly",),
    "compare": ("plotly",),
    "dashboard": ("starlette", "uvicorn", "plotly"),
}


# the commands that build or read runs: each takes --plugin
PLUGIN_COMMANDS = ("run", "resume", "sweep", "compare-iid", "report", "show", "server", "client")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedforge", description="Federated learning for PyTorch.")
    parser.add_argument("--version", action="version", version=f"fedforge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a federated training job")
    run.add_argument("--config", "-c", type=Path, help="YAML config file (defaults if absent)")
    run.add_argument(
        "--set",
        "-s",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, dotted for sections (partition.alpha=0.5)",
    )
    run.add_argument("--data-dir", help="where the data sets are (else $FEDFORGE_DATA)")
    run.add_argument("--runs-dir", help="where run directories go (config: runs_dir)")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    run.add_argument(
        "--resume",
        metavar="RUN",
        help="continue RUN from its last good checkpoint (same as 'fedforge resume RUN')",
    )

    resume = sub.add_parser("resume", help="continue a stopped run from its last checkpoint")
    add_run_lookup(resume)
    resume.add_argument("--data-dir", help="where the data sets are (else the run's own setting)")
    resume.add_argument(
        "--device", help="cpu, cuda, cuda:N or auto: where to go on training (else the run's own)"
    )
    resume.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    runs = sub.add_parser("runs", help="list the runs in a runs directory")
    runs.add_argument("--runs-dir", default="runs")

    show = sub.add_parser("show", help="print the summary of one run")
    add_run_lookup(show)
    dashboard.add_parser(sub)

    audit_cli.add_parser(sub)

    report = sub.add_parser("report", help="write one run as a self-contained HTML page")
    add_run_lookup(report)
    report.add_argument(
        "-o", "--out", type=Path, help="the HTML file (default: RUN_ID.html in this folder)"
    )
    compare_runs = sub.add_parser(
        "compare", help="several runs' curves overlaid and their summaries, as one HTML page"
    )
    compare_runs.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="a run (as for show), a glob pattern of run names ('NAME-*': a sweep's "
        "points) or a folder of runs",
    )
    compare_runs.add_argument("--runs-dir", default="runs", help="where to look (default: runs)")
    compare_runs.add_argument(
        "-o", "--out", type=Path, default=Path("compare.html"), help="(default: compare.html)"
    )
    observe_cli.add_parsers(sub)  # alerts, export
    profile_cli.add_parser(sub)

    sweep = sub.add_parser("sweep", help="run a grid of configs in sequence (resumable), one table")
    sweep.add_argument("config", type=Path, help="YAML config file")
    sweep.add_argument(
        "--grid",
        "-g",
        action="append",
        required=True,
        metavar="FIELD=V1,V2",
        help="values of one field (repeat for more fields: the grid is their product)",
    )
    models = sub.add_parser("models", help="a run's model versions: list, promote, roll back")
    actions = models.add_subparsers(dest="models_command", required=True)
    add_run_lookup(actions.add_parser("list", help="list the versions; * marks the serving one"))
    promote = actions.add_parser("promote", help="make a version the one serving every client")
    add_run_lookup(promote)
    promote.add_argument("version_id", type=int, metavar="ID", help="the version to promote")
    rollback = actions.add_parser(
        "rollback", help="withdraw the canary or the serving version for good"
    )
    add_run_lookup(rollback)
    rollback.add_argument(
        "version_id",
        type=int,
        nargs="?",
        metavar="ID",
        help="the version (default: the canary if there is one, else the serving version)",
    )
    compare = sub.add_parser(
        "compare-iid", help="run a config on an IID split and on its own; print the accuracy gap"
    )
    compare.add_argument("config", type=Path, help="YAML config file")
    for p in (sweep, compare):
        p.add_argument("--set", "-s", action="append", default=[], metavar="FIELD=VALUE")
        p.add_argument("--data-dir", help="where the data sets are (else $FEDFORGE_DATA)")
        p.add_argument("--runs-dir", help="where run directories go (config: runs_dir)")
        p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    from fedforge.transport.commands import add_parsers as add_deployment

    add_deployment(sub)  # server, client
    certs_cli.add_parsers(sub)
    for name in PLUGIN_COMMANDS:
        sub.choices[name].add_argument(
            "--plugin",
            action="append",
            default=[],
            metavar="MODULE_OR_FILE",
            help="import a module or a .py file that registers components (repeatable); "
            "installed fedforge.plugins entry points load without it",
        )
    return parser


def _cmd_server(args: argparse.Namespace) -> int:
    from fedforge.transport import commands

    if args.resume and (args.config or args.set):
        raise ConfigError("--resume continues with the config stored in the run")
    return _finish(commands.server(None if args.resume else _resolve_config(args), args))


def _cmd_client(args: argparse.Namespace) -> int:
    from fedforge.transport import commands

    return commands.client(args)


def _resolve_config(args: argparse.Namespace) -> Config:
    from fedforge import config as config_mod
    from fedforge.config.overrides import with_overrides

    overrides = dict(config_mod.parse_override(item) for item in args.set)
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.runs_dir:
        overrides["runs_dir"] = args.runs_dir
    if args.config:  # the file and its overrides, checked once as one config
        return config_mod.load(args.config, overrides)
    return config_mod.from_dict(with_overrides({}, overrides))


def _finish(result: RunResult) -> int:
    from fedforge.server.loop import format_summary

    if result.stopped is not None:
        print(f"fedforge: {result.summary.get('error', 'stopped')}", file=sys.stderr)
        return 128 + int(signal.Signals[result.stopped])
    print(format_summary(result.summary))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    if args.resume:
        if args.config or args.set:
            raise ConfigError(
                "--resume continues with the config stored in the run; "
                "it cannot be combined with --config or --set"
            )
        args.run = args.resume
        args.runs_dir = args.runs_dir or "runs"
        return _cmd_resume(args)
    cfg = _resolve_config(args)
    from fedforge import config as config_mod
    from fedforge.config import step_sizes
    from fedforge.report.progress import count
    from fedforge.server.loop import run

    print(
        f"fedforge: {cfg.algorithm} {config_mod.describe_task(cfg)}, {cfg.num_clients} clients "
        f"({config_mod.describe_split(cfg)}), C={cfg.client_fraction} E={cfg.local_epochs} "
        f"B={cfg.batch_size or 'all'} {step_sizes(cfg)}, up to {count(cfg.rounds, 'round')}",
        flush=True,
    )
    result = run(cfg, progress=not args.quiet)
    return _finish(result)


def _cmd_resume(args: argparse.Namespace) -> int:
    from fedforge import config as config_mod
    from fedforge.server.loop import resume
    from fedforge.store import RunStore, resolve_run
    from fedforge.tasks import load_task_data

    path = resolve_run(args.runs_dir, args.run)
    data = None
    if args.data_dir:  # where the data is read from does not change what it is
        with RunStore.open(path, read_only=True) as store:
            stored = store.config()
        data = load_task_data(config_mod.override(stored, {"data_dir": args.data_dir}))
    device = getattr(args, "device", None)  # 'run --resume' takes the run's own
    return _finish(resume(path, data=data, progress=not args.quiet, device=device))


def _cmd_runs(args: argparse.Namespace) -> int:
    from fedforge.report.runs import format_run_table
    from fedforge.store import list_runs

    if not Path(args.runs_dir).exists():
        print(f"no runs: '{args.runs_dir}' does not exist")
        return 0
    print(format_run_table(list_runs(args.runs_dir)))
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from fedforge.report.runs import format_run_summary

    with open_run(args) as store:
        print(format_run_summary(store))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from fedforge.report.html import write_report
    from fedforge.store import resolve_run

    path = resolve_run(args.runs_dir, args.run)
    out = write_report(path, args.out or Path(f"{path.name}.html"))
    print(f"wrote {out}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from fedforge.report.html import write_compare
    from fedforge.store.runs_dir import resolve_runs

    paths = resolve_runs(args.runs_dir, args.runs)
    out = write_compare(paths, args.out)
    print(f"wrote {out} ({len(paths)} runs)")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from fedforge.server.sweep import PointResult, format_sweep, parse_grid, run_sweep

    grid = parse_grid(args.grid)
    results: list[PointResult] = []
    try:
        run_sweep(_resolve_config(args), grid, progress=not args.quiet, echo=print, into=results)
    except FedforgeError:  # e.g. a point the build refuses: the finished ones first
        if results:
            print(format_sweep(results))
        raise
    print(format_sweep(results))
    return _stopped_status(r.stopped for r in results)


def _cmd_compare_iid(args: argparse.Namespace) -> int:
    from fedforge.server.sweep import compare_iid, format_compare

    iid, own = compare_iid(_resolve_config(args), progress=not args.quiet)
    print(format_compare(iid, own))
    return _stopped_status((iid.stopped, own.stopped if own is not None else None))


def _cmd_models(args: argparse.Namespace) -> int:
    from fedforge.report.models_cli import run_models_command

    return run_models_command(args)


def _stopped_status(stopped: Iterable[str | None]) -> int:
    """128 + the number of the signal that stopped a point (130, 143); 0 if none did."""
    name = next((s for s in stopped if s is not None), None)
    return 0 if name is None else 128 + int(signal.Signals[name])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedforge`` command; returns the exit status."""
    commands = {
        "run": _cmd_run,
        "resume": _cmd_resume,
        "runs": _cmd_runs,
        "show": _cmd_show,
        **audit_cli.COMMANDS,
        "report": _cmd_report,
        "compare": _cmd_compare,
        "sweep": _cmd_sweep,
        "compare-iid": _cmd_compare_iid,
        "dashboard": dashboard.run,
        "server": _cmd_server,
        "client": _cmd_client,
        **certs_cli.COMMANDS,
        "models": _cmd_models,
        **observe_cli.COMMANDS,
        **profile_cli.COMMANDS,
    }
    try:
        args = _parser().parse_args(argv)
        try:
            absent = next((m for m in NEEDS.get(args.command, ()) if not installed(m)), None)
            if absent is not None:  # said before torch loads, in a fraction of a second
                raise ModuleNotFoundError(absent, name=absent)
            if args.command not in certs_cli.COMMANDS:  # the others load torch: first, then ours
                load_torch()
            if args.command in PLUGIN_COMMANDS:  # before any config names a component
                load_plugins(args.plugin)
            return commands[args.command](args)
        except ModuleNotFoundError as exc:
            extra = extra_of(exc.name or "")
            if extra is None:
                raise
            print(
                f"fedforge: error: 'fedforge {args.command}' needs the '{extra}' extra "
                f"(no module '{exc.name}'): pip install 'fedforge[{extra}]'",
                file=sys.stderr,
            )
            return EXIT_USER_ERROR
    except FedforgeError as exc:
        notes = "".join(f" {n}" for n in getattr(exc, "__notes__", []))
        print(f"fedforge: error: {exc}{notes}", file=sys.stderr)
        return EXIT_USER_ERROR
    except StopNow as exc:  # a second signal during a run
        print(f"fedforge: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print("fedforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `fedforge show RUN | head -1`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
