"""Observability's figures in one line: the HTML report of a 1,000-round,
1,000-client run (benchmarks/report.py) and the dashboard's latency from a
round's commit to the browser (benchmarks/dashboard_latency.py), each run as its
own process, one after the other, so neither slows the other.

    python benchmarks/observability.py          # the full figures
    python benchmarks/observability.py --quick  # a smoke run (smaller store, fewer samples)

Each benchmark writes its own JSON (benchmarks/results/report/report.json,
benchmarks/results/dashboard/dashboard.json; ``--quick``: benchmarks/out/).
Last line: ``RESULT report_s=... report_mib=... dashboard_latency_s=...``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _result(script: str, args: list[str]) -> dict[str, str]:
    """The ``k=v`` fields of the last line a benchmark printed."""
    done = subprocess.run(
        [sys.executable, str(HERE / script), *args], check=True, capture_output=True, text=True
    )
    sys.stdout.write(done.stdout)
    last = done.stdout.strip().splitlines()[-1]
    if not last.startswith("RESULT "):
        raise SystemExit(f"{script} ended without a RESULT line: {last!r}")
    return dict(field.split("=", 1) for field in last.split()[1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller store, fewer browser samples")
    args = p.parse_args(argv)
    quick = ["--quick"] if args.quick else []
    fields = {**_result("report.py", quick), **_result("dashboard_latency.py", quick)}
    order = ("report_s", "report_mib", "dashboard_latency_s")
    print("RESULT " + " ".join(f"{k}={fields[k]}" for k in order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
