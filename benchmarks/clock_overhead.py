"""What the virtual clock costs the simulator: seconds per round of the same
run without system profiles and with them (``systems.draw: true``, every
client always online, no failures, no deadline: the clock's bookkeeping on
every round, and nothing it would drop).

MNIST 2NN, McMahan et al. 2017's IID config (configs/2nn_iid_e1_b10.yaml: 100
clients, C = 0.1, E = 1, B = 10) on the vectorised engine, in one process on
one torch thread, ``--rounds`` rounds a run, no evaluation but the closing
one, on a test set of one image. The arms run alternately (A B, then B A,
...) after one discarded warm-up run each; a round hook takes each round's
CPU seconds (on one thread, the round's own work, which other jobs on the
machine do not inflate) and wall seconds. The figure is the ratio of the
arms' median CPU seconds per round. With the clock the uploads are summed in
their arrival order, not the engine's: the models agree to float rounding
(the largest difference is printed).

    FEDFORGE_DATA=/work/shared/data python benchmarks/clock_overhead.py

Last line: ``RESULT clock_overhead=X clock_s_per_round=Y plain_s_per_round=Z``
(target: X <= 1.05).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from fedforge import config as config_mod

ROOT = Path(__file__).resolve().parent.parent
ARMS: dict[str, dict[str, Any]] = {"plain": {}, "clock": {"systems.draw": True}}


# the interleaved, timed runs of each arm: plugins.py's
sys.path.insert(0, str(Path(__file__).resolve().parent))
from plugins import timed_arms  # noqa: E402  (benchmarks/ is no package)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=4, help="timed runs per arm")
    p.add_argument("--data-dir")
    args = p.parse_args(argv)
    os.environ.setdefault("FEDFORGE_PROBE", "off")  # the engine is the config's
    fields: dict[str, Any] = {
        "rounds": args.rounds,
        "engine": "vectorized",
        "workers": 1,
        "threads": 1,
        "evaluation.every": 10**6,
        "target_accuracy": None,
        "checkpoint_every": 0,
    }
    if args.data_dir:
        fields["data_dir"] = args.data_dir
    base = config_mod.override(config_mod.load(ROOT / "configs" / "2nn_iid_e1_b10.yaml"), fields)
    clocks, finals = timed_arms(base, ARMS, args.repeats, "2nn")
    gap = float((finals["clock"] - finals["plain"]).abs().max())
    cpu = {arm: statistics.median(c.cpu) for arm, c in clocks.items()}
    wall = {arm: statistics.median(c.wall) for arm, c in clocks.items()}
    print(
        f"2nn (vectorized), median s/round over {len(clocks['clock'].cpu)} rounds: cpu plain "
        f"{cpu['plain']:.4f} clock {cpu['clock']:.4f} (x{cpu['clock'] / cpu['plain']:.3f}); "
        f"wall plain {wall['plain']:.4f} clock {wall['clock']:.4f} "
        f"(x{wall['clock'] / wall['plain']:.3f}); largest model difference {gap:.2e}",
        flush=True,
    )
    print(
        f"RESULT clock_overhead={cpu['clock'] / cpu['plain']:.3f} "
        f"clock_s_per_round={cpu['clock']:.4f} plain_s_per_round={cpu['plain']:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
