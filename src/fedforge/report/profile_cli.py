"""``fedforge profile RUN``: a deployment's measured client times and
availability as the profile CSV the simulator reads (``systems.profiles``), so
that a population measured for real can be simulated under other choices (a
selection policy, a codec, asynchronous aggregation) before they are tried on
it. The derivation is ``systems/calibrate.py``; this reads the run store,
read-only, and writes the file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from fedforge.core.errors import DataError
from fedforge.report.run_args import add_run_lookup, open_run


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``profile`` subcommand."""
    profile = sub.add_parser(
        "profile",
        help="a deployment's measured client speeds and bandwidths as a profile CSV "
        "(systems.profiles)",
    )
    add_run_lookup(profile)
    profile.add_argument(
        "--out", type=Path, metavar="FILE.csv", help="where to write (default: <run>-profile.csv)"
    )


def cmd_profile(args: argparse.Namespace) -> int:
    from fedforge.store.presence import read_presence
    from fedforge.systems.calibrate import measured_profiles
    from fedforge.systems.profile import write_profiles

    with open_run(args) as store:
        name = store.path.name
        _, engine = store.score_and_engine()
        times = store.read_rows("client_times")
        work = store.read_rows("client_work")
        num_clients = store.config_data().get("num_clients")
        presence = read_presence(store)
    if engine != "remote":
        raise DataError(
            f"run '{name}' ran on the {engine or 'unknown'} engine, not in a deployment: its "
            "client times are not measured (profile a run of fedforge server)"
        )
    if not times:
        raise DataError(
            f"run '{name}' holds no measured client times (client_times): no round asked a "
            "client to train, or fedforge server of an earlier version ran it"
        )
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise DataError(f"run '{name}' holds a damaged config: num_clients = {num_clients!r:.40}")
    profiles, notes = measured_profiles(times, work, num_clients, presence)
    out = args.out or Path(f"{name}-profile.csv")
    try:
        write_profiles(out, profiles)
    except OSError as exc:
        raise DataError(f"cannot write {out}: {exc.strerror or exc}") from None
    for note in notes:
        print(f"fedforge: note: {note}", file=sys.stderr)
    asked = len({int(row[1]) for row in times})
    print(f"wrote {out}: {num_clients} clients, {asked} of them asked to train in the run")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"profile": cmd_profile}
