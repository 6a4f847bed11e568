"""bf16 convergence of the default job with fc1's steps deferred, side by side.

    python benchmarks/bf16_convergence.py [--seeds config,3] [--rounds 40]

Rounds to 99% from one seed is a noisy figure: the CNN's accuracy sits within a
test image or two of 99% for rounds at a time. So this runs the default job
(``configs/default.yaml``) with no stop for ``--rounds`` rounds, at each seed,
three ways: bf16 with fc1's weight steps deferred (``FOLD_ROWS`` 80, what bf16
runs), bf16 with them folded in at every step (``FOLD_ROWS`` 1: the step-by-step
update of earlier sessions), and fp32. For each: the first round at 99% and
the mean test accuracy over the second half of the rounds.
Last line: RESULT with the mean accuracies' gaps, deferred minus step-by-step.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import fedforge as ff
from fedforge import config as config_mod
from fedforge.client import deferred_sgd

VARIANTS = {"deferred": ("bf16", 80), "step_by_step": ("bf16", 1), "fp32": ("fp32", 80)}


def curve(seed: str, precision: str, fold_rows: int, rounds: int, root: Path) -> list[float]:
    """Test accuracy after each round of the default job at ``seed``."""
    deferred_sgd.FOLD_ROWS = fold_rows  # the workers are forked: they see it
    base = config_mod.load(Path(__file__).parent.parent / "configs" / "default.yaml")
    changes: dict[str, object] = {"precision": precision, "target_accuracy": None}
    changes |= {"rounds": rounds, "runs_dir": str(root)}
    if seed != "config":
        changes["seed"] = int(seed)
    result = ff.run(config_mod.override(base, changes))
    with ff.RunStore.open(result.run_dir) as store:
        return [r.test_accuracy for r in store.rounds()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="config,3")
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args(argv)
    half = args.rounds // 2
    gaps = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds.split(","):
            means = {}
            for name, (precision, rows) in VARIANTS.items():
                acc = curve(seed, precision, rows, args.rounds, Path(tmp))
                first = next((i + 1 for i, a in enumerate(acc) if a >= 0.99), None)
                means[name] = sum(acc[half:]) / (args.rounds - half)
                print(
                    f"seed {seed} {name:13s} first round at 99%: {first}  "
                    f"mean accuracy rounds {half + 1}-{args.rounds}: {means[name]:.4f}",
                    flush=True,
                )
            gaps[f"gap_seed_{seed}"] = means["deferred"] - means["step_by_step"]
    print("RESULT " + " ".join(f"{k}={v:+.4f}" for k, v in gaps.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
