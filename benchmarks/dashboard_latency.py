"""The dashboard's update latency: from a round's commit in the run store to the
browser holding the new point on its plot (target: under 2 s).

    python benchmarks/dashboard_latency.py              # 30 samples
    python benchmarks/dashboard_latency.py --quick      # 5 samples, JSON to benchmarks/out/

A run store is made in a temporary folder (its lock held, as a running loop
holds it); ``fedforge dashboard`` is started as its own process over it, and the
run's page opened in headless Chromium (the system's binary, through
Playwright). A script in the page notes ``Date.now()`` at the first animation
frame where the accuracy plot holds each new point. Each sample: a pause of
0.2-0.7 s (so commits fall anywhere in the dashboard's poll interval),
``time.time()`` just before ``RunStore.record_round``, then the wait for the
page to note the point; the sample is the page's time minus the commit's (one
clock: both processes are on this machine). The figure is the median;
p90 and max are in the JSON.

``measure(samples)`` returns the median in seconds, for another benchmark.
The JSON goes to benchmarks/results/dashboard/dashboard.json (``--quick``:
benchmarks/out/). Last line: ``RESULT dashboard_latency_s=...``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, machine, result_line
from fedforge.config import Config, override
from fedforge.report.dashboard.process import start_dashboard
from fedforge.report.dashboard.watch import POLL_S
from fedforge.server.state import RunLock
from fedforge.store import RoundRecord, RunStore

PLOT = "plot-accuracy"
# notes when the plot first holds each number of points (page time, ms)
NOTE_POINTS = """id => {
  window.seenAt = {};
  const tick = () => {
    const n = document.getElementById(id).data?.[0]?.x?.length ?? 0;
    if (!(n in window.seenAt)) window.seenAt[n] = Date.now();
    requestAnimationFrame(tick);
  };
  tick();
}"""


def _round(r: int) -> RoundRecord:
    return RoundRecord(r, 10, 1.0 / (r + 1), r / (r + 10), 1.0, 4096, 4096, 0, 0.1, 0.5)


def measure_samples(samples: int, seed: int = 0) -> tuple[list[float], dict[str, Any]]:
    """``samples`` latencies in seconds, and what they were measured with."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no chromium binary on PATH (apt-get install chromium)")
    pause = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="dashboard-latency-"))
    store = RunStore.create(tmp / "runs", override(Config(), {"name": "latency", "rounds": 1000}))
    lock = RunLock(store.path).acquire()
    out: list[float] = []
    try:
        store.record_round(_round(0), [])
        with (
            start_dashboard(tmp / "runs", log=tmp / "dashboard.log") as dash,
            sync_playwright() as p,
        ):
            browser = p.chromium.launch(executable_path=chromium, headless=True)
            page = browser.new_page()
            page.goto(f"{dash.url}runs/{store.path.name}")
            page.wait_for_function(f"document.getElementById('{PLOT}').data?.[0]?.x?.length === 1")
            page.evaluate(NOTE_POINTS, PLOT)
            for k in range(1, samples + 1):
                time.sleep(pause.uniform(0.2, 0.7))
                committed = time.time()
                store.record_round(_round(k), [])
                seen = page.wait_for_function(
                    "n => window.seenAt[n]", arg=k + 1, timeout=30_000, polling=10
                ).json_value()
                out.append(seen / 1000 - committed)
            info = {"chromium": browser.version, "poll_s": POLL_S}
            browser.close()
    finally:
        lock.release()
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out, info


def measure(samples: int) -> float:
    """The median latency, in seconds, over ``samples`` commits."""
    return statistics.median(measure_samples(samples)[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="5 samples; JSON to benchmarks/out/")
    p.add_argument("--out", type=Path, help="the JSON (default: results/dashboard/)")
    args = p.parse_args(argv)
    samples = 5 if args.quick else args.samples
    before = machine()
    t0 = time.perf_counter()
    latencies, info = measure_samples(samples)
    ordered = sorted(latencies)
    figures = {
        "dashboard_latency_s": statistics.median(ordered),
        "p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max_s": ordered[-1],
        "min_s": ordered[0],
    }
    record = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {**before, "loadavg_end": os.getloadavg(), **info},
        "samples": samples,
        "seconds": time.perf_counter() - t0,
        "figures": figures,
        "latencies_s": latencies,
    }
    dest = args.out or ROOT / "benchmarks" / ("out" if args.quick else "results") / "dashboard"
    path = dest if dest.suffix == ".json" else dest / "dashboard.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    median, p90, top = figures["dashboard_latency_s"], figures["p90_s"], figures["max_s"]
    print(
        f"wrote {path}: median {median:.3f} s, p90 {p90:.3f} s, max {top:.3f} s "
        f"over {samples} commits (poll every {POLL_S} s)"
    )
    print(result_line({"dashboard_latency_s": figures["dashboard_latency_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
