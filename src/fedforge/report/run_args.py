"""The command-line arguments that name one stored run, RUN and --runs-dir,
shared by every command that reads or continues one (``show``, ``report``,
``resume``, ``alerts``, ``export``...), and the run store they name, opened
read-only."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store loads with the command that opens one, not with its arguments
    from fedforge.store.runstore import RunStore


def add_run_lookup(parser: argparse.ArgumentParser) -> None:
    """The arguments that name one existing run: RUN and --runs-dir."""
    parser.add_argument(
        "run",
        help="run directory, its folder name, a unique prefix or suffix of that, "
        "or a prefix of its config name",
    )
    parser.add_argument("--runs-dir", default="runs", help="where to look (default: runs)")


def open_run(args: argparse.Namespace) -> RunStore:
    """The run store ``args.run`` names (in ``args.runs_dir``), read-only."""
    from fedforge.store.runs_dir import resolve_run
    from fedforge.store.runstore import RunStore

    return RunStore.open(resolve_run(Path(args.runs_dir), args.run), read_only=True)
