"""Systems heterogeneity: virtual time to a target accuracy for each cohort
selection policy and for FedBuff against synchronous FedAvg, on a drawn
heterogeneous population, with rounds, bytes, final accuracy and the
participation figures beside each; a CNN spot check; the clock's cost.

MNIST 2NN, 1,000 clients, Dirichlet(0.3) labels, E = 1, B = 10, lr 0.05. The
population (``systems.draw``, seed 0):

- compute: lognormal, median 20 examples/s, sigma 1.0 (1st to 99th
  percentile ratio exp(2 * 2.326) = 105x);
- bandwidth: three classes (wifi 50%, 4G 35%, 3G 15%), download medians 20,
  2 and 0.4 MB/s (50x), upload half that, sigma 0.3 within a class;
  latency median 50 ms;
- availability: online spells of mean 35 min, offline of mean 15 min
  (30% offline at any time); failure probability 2% a started round.

Synchronous rounds ask 20 online clients (C = 0.02) with a 30 s deadline
(late uploads are dropouts, as a practitioner's server would drop them);
FedBuff keeps M = 20 clients at work and steps every K = 10 updates
(staleness weight 1/sqrt(1+s)), with no deadline (it never waits for one
client). For context (not in the RESULT line): uniform without the deadline,
and uniform and Oort with 30% over-selection (ask 26, take the first 20 to
arrive; Oort's own setting), with the deadline. Oort with its blacklist (a
client asked in more than 10, or 5, rounds is asked no more), with the
deadline, and the latter with over-selection, are in the RESULT line. Target:
95% test accuracy, evaluated every 5 rounds (a FedBuff step is a round), at
most 600 rounds (FedBuff 1,200 steps; a run stops at the target). The CNN spot check runs
the uniform synchronous arm for ``--cnn-rounds`` rounds and records its cost.
The clock's overhead is benchmarks/clock_overhead.py's measurement, run here.

    FEDFORGE_DATA=/work/shared/data python benchmarks/systems.py

Last line: ``RESULT tta_uniform_h= tta_poc_speedup= tta_oort_speedup=
tta_fedbuff_speedup= tta_oort_blacklist10_speedup= tta_oort_blacklist5_speedup=
participation_jain_uniform= participation_jain_floor= participation_jain_oort=
participation_jain_oort_blacklist10= participation_jain_oort_blacklist5=
clock_overhead=`` (hours of virtual time for uniform; a speedup is uniform's
time over the arm's).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clock_overhead  # noqa: E402  (benchmarks/ is no package)
from fedforge.config import from_dict  # noqa: E402
from fedforge.server.loop import run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "systems"
SYSTEMS: dict[str, Any] = {
    "draw": True,
    "compute_median": 20.0,
    "compute_sigma": 1.0,
    "bandwidth_weights": [0.5, 0.35, 0.15],
    "download_median_bps": [20e6, 2e6, 0.4e6],
    "upload_median_bps": [10e6, 1e6, 0.2e6],
    "bandwidth_sigma": 0.3,
    "latency_median_s": 0.05,
    "mean_online_s": 2100.0,
    "mean_offline_s": 900.0,
    "failure_prob": 0.02,
}
DEADLINE_S = 30.0
OVER_SELECTION = 0.3
BASE: dict[str, Any] = {
    "model": "2nn",
    "algorithm": "fedavg",
    "num_clients": 1000,
    "partition": {"kind": "dirichlet", "alpha": 0.3},
    "client_fraction": 0.02,
    "local_epochs": 1,
    "batch_size": 10,
    "lr": 0.05,
    "target_accuracy": 0.95,
    "evaluation": {"every": 5},
    "engine": "vectorized",
    "workers": 1,
    "threads": 1,
    "checkpoint_every": 0,
    "seed": 0,
}


def _oort_blacklist(rounds: int) -> dict[str, Any]:
    """Oort that asks no client in more than ``rounds`` rounds."""
    return {
        "selection": {"policy": "oort"},
        "plugin_options": {"oort": {"blacklist_rounds": rounds}},
    }


ARMS: dict[str, dict[str, Any]] = {
    "uniform": {"selection": {"policy": "uniform"}},
    "power_of_choice": {"selection": {"policy": "power_of_choice"}},
    "oort": {"selection": {"policy": "oort"}},
    "fairness_floor": {
        "selection": {"policy": "fairness_floor"},
        "plugin_options": {"fairness_floor": {"period": 100}},  # 1,000 / 20 = 50 at least
    },
    # context, not in the RESULT line: the synchronous rounds without a deadline,
    # and uniform and Oort asking 30% more and taking the first 20 (Oort's setting)
    "uniform_no_deadline": {"selection": {"policy": "uniform"}},
    "uniform_over": {"selection": {"policy": "uniform"}},
    "oort_over": {"selection": {"policy": "oort"}},
    # in the RESULT line: Oort's blacklist (Lai et al. 2021), a client asked in
    # more than 10 (5) rounds asked no more; 160 rounds of 20 ask a client 3.2
    # times on average
    "oort_blacklist10": _oort_blacklist(10),
    "oort_blacklist5": _oort_blacklist(5),
    "oort_over_blacklist5": _oort_blacklist(5),
    "fedbuff": {
        "asynchronous": {"mode": "fedbuff", "concurrency": 20, "buffer_size": 10},
        "robust": {"max_norm_multiple": None},  # stale updates are larger, not faults
    },
}


def config(arm: str, rounds: int, model: str = "2nn") -> Any:
    systems = dict(SYSTEMS)
    fields = {**BASE, **ARMS[arm], "model": model, "rounds": rounds}
    if arm == "fedbuff":
        fields["rounds"] = 2 * rounds  # a step takes half a cohort's updates
    elif arm != "uniform_no_deadline":
        systems["deadline_s"] = DEADLINE_S
    if "_over" in arm:
        systems["over_selection"] = OVER_SELECTION
    fields["systems"] = systems
    return from_dict(fields)


def one(arm: str, rounds: int, model: str = "2nn") -> dict[str, Any]:
    t0 = time.perf_counter()
    result = run(config(arm, rounds, model), store=False)
    s = result.summary
    p = s.get("participation", {})
    row = {
        "arm": arm,
        "model": model,
        "rounds_done": s["rounds_done"],
        "rounds_to_target": s["rounds_to_target"],
        "virtual_h_to_target": (
            s["virtual_seconds_to_target"] / 3600
            if s.get("virtual_seconds_to_target") is not None
            else None
        ),
        "virtual_h": s["virtual_seconds"] / 3600,
        "virtual_s_per_round": s["virtual_seconds"] / max(s["rounds_done"], 1),
        "bytes_to_target_mb": (
            s["bytes_to_target"] / 1e6 if s.get("bytes_to_target") is not None else None
        ),
        "final_accuracy": s["final_accuracy"],
        "best_accuracy": s["best_accuracy"],
        "jain_used": p.get("jain_used"),
        "jain_asked": p.get("jain_asked"),
        "never_asked": p.get("never_asked"),
        "wall_s": time.perf_counter() - t0,
    }
    print(json.dumps(row), flush=True)
    return row


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=600)
    p.add_argument("--cnn-rounds", type=int, default=20)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--skip-overhead", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("FEDFORGE_PROBE", "off")
    rows = {arm: one(arm, args.rounds) for arm in args.arms.split(",")}
    cnn = one("uniform", args.cnn_rounds, "cnn") if args.cnn_rounds > 0 else None
    overhead = None
    if not args.skip_overhead:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            clock_overhead.main([])
        last = text.getvalue().strip().splitlines()[-1]
        print(f"clock_overhead.py: {last}", flush=True)
        overhead = float(last.split("clock_overhead=")[1].split()[0])
    pct = f"{BASE['target_accuracy']:.0%}"
    print(
        f"| arm | rounds to {pct} | virtual h to {pct} | speedup | MB to {pct} | final acc "
        "| virtual s/round | Jain (asked) | never asked | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = rows.get("uniform", {}).get("virtual_h_to_target")
    speed: dict[str, float | None] = {}
    for arm, r in rows.items():
        h = r["virtual_h_to_target"]
        speed[arm] = base / h if base is not None and h else None
        print(
            f"| {arm} | {_fmt(r['rounds_to_target'], '.0f')} | {_fmt(h, '.3f')} "
            f"| {_fmt(speed[arm], '.2f')} | {_fmt(r['bytes_to_target_mb'], '.0f')} "
            f"| {_fmt(r['final_accuracy'], '.4f')} | {r['virtual_s_per_round']:.1f} "
            f"| {_fmt(r['jain_asked'], '.3f')} "
            f"| {r['never_asked']} | {r['wall_s']:.0f} |"
        )
    if cnn is not None:
        print(
            f"CNN spot check (uniform, {cnn['rounds_done']} rounds): final accuracy "
            f"{_fmt(cnn['final_accuracy'], '.4f')}, {cnn['virtual_h']:.3f} virtual h, "
            f"{cnn['wall_s']:.0f} wall s ({cnn['wall_s'] / max(cnn['rounds_done'], 1):.1f} s/round)"
        )

    def jain(arm: str) -> str:
        return _fmt(rows.get(arm, {}).get("jain_asked"), ".3f")

    print(
        f"RESULT tta_uniform_h={_fmt(base, '.3f')} "
        f"tta_poc_speedup={_fmt(speed.get('power_of_choice'), '.2f')} "
        f"tta_oort_speedup={_fmt(speed.get('oort'), '.2f')} "
        f"tta_fedbuff_speedup={_fmt(speed.get('fedbuff'), '.2f')} "
        f"tta_oort_blacklist10_speedup={_fmt(speed.get('oort_blacklist10'), '.2f')} "
        f"tta_oort_blacklist5_speedup={_fmt(speed.get('oort_blacklist5'), '.2f')} "
        f"participation_jain_uniform={jain('uniform')} "
        f"participation_jain_floor={jain('fairness_floor')} "
        f"participation_jain_oort={jain('oort')} "
        f"participation_jain_oort_blacklist10={jain('oort_blacklist10')} "
        f"participation_jain_oort_blacklist5={jain('oort_blacklist5')} "
        f"clock_overhead={_fmt(overhead, '.3f')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
