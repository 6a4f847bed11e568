"""McMahan et al. 2017, Table 2: rounds to target accuracy, ours vs the paper.

    python benchmarks/mcmahan_table2.py --rows cnn_iid_e1_b10,cnn_iid_fedsgd --grid 3
    python benchmarks/mcmahan_table2.py --rows shakespeare_noniid_e1_b10 --grid 3
    python benchmarks/mcmahan_table2.py --e-curve 1.47   # Shakespeare at E = 1, 5, 20

Each row is the config ``configs/<row>.yaml``. For each row the script runs a
learning-rate grid spaced 10^(1/3) apart around the config's lr (``--grid N``:
N points, or ``--lrs`` explicitly), in the order centre, then neighbours. A
later grid point is capped at the best rounds found so far (a run that needs
more rounds cannot win), so a grid costs little more than its best run. Each
finished (row, lr) is saved as JSON under ``--out`` (benchmarks/results/table2,
tracked in git); rerunning skips it, so the benchmark resumes across sessions,
and ``--report`` prints the table from what is saved.
A row named ``scaled01_<row>`` is ``<row>`` on MNIST pixels in [0, 1]
(``input_scaling: unit``): it is shown beside the paper's figure for ``<row>``.
Last line: ``RESULT <row>_rounds=... <row>_paper=...`` for every row with a result.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

import _common
from _common import central_baseline
from fedforge import config as config_mod
from fedforge.data.federated import load_federated_data
from fedforge.server.loop import run
from fedforge.server.sweep import run_point as run_or_resume
from fedforge.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
STEP = 10 ** (1 / 3)
RUNS = ROOT / "benchmarks" / "out" / "runs"  # run stores (not tracked)

# Table 2 of the paper: rounds to 99% (CNN) / 97% (2NN), C = 0.1, IID / non-IID.
PAPER: dict[str, int] = {}
# Shakespeare LSTM, rounds to 54% (C = 0.1), IID / by role
PAPER_SHAKESPEARE = {
    "fedsgd": (2488, 3906),
    "e1_b50": (1635, 549),
    "e5_binf": (613, 597),
    "e1_b10": (460, 164),
    "e5_b50": (401, 152),
    "e5_b10": (192, 41),
}
for _tag, (_iid, _non) in PAPER_SHAKESPEARE.items():
    PAPER[f"shakespeare_iid_{_tag}"] = _iid
    PAPER[f"shakespeare_noniid_{_tag}"] = _non
for _model, _rows in {
    "cnn": {
        "fedsgd": (626, 483),
        "e5_binf": (179, 1000),
        "e1_b50": (65, 600),
        "e20_binf": (234, 672),
        "e1_b10": (34, 350),
        "e5_b50": (29, 334),
        "e20_b50": (32, 426),
        "e5_b10": (20, 229),
        "e20_b10": (18, 173),
    },
    "2nn": {
        "fedsgd": (1468, 1817),
        "e10_binf": (156, 1100),
        "e1_b50": (144, 1183),
        "e20_binf": (92, 957),
        "e1_b10": (92, 831),
        "e10_b50": (45, 881),
        "e20_b50": (39, 835),
        "e10_b10": (34, 497),
        "e20_b10": (32, 738),
    },
}.items():
    for _tag, (_iid, _non) in _rows.items():
        PAPER[f"{_model}_iid_{_tag}"] = _iid
        PAPER[f"{_model}_noniid_{_tag}"] = _non
# variants of a row (the same row with one setting changed), named <prefix><row>
VARIANTS = ("scaled01_",)  # input_scaling: unit
for _row in list(PAPER):
    for _prefix in VARIANTS:
        PAPER[_prefix + _row] = PAPER[_row]


def split_row(row: str) -> tuple[str, str, str]:
    """A row's variant prefix ('' for none), model and split: scaled01_2nn_iid_e1_b10
    is ('scaled01_', '2nn', 'iid')."""
    prefix = next((p for p in VARIANTS if row.startswith(p)), "")
    model, split = row[len(prefix) :].split("_")[:2]
    return prefix, model, split


def grid(centre: float, points: int) -> list[float]:
    """``points`` learning rates spaced 10^(1/3) apart, centre first, then
    alternating above and below."""
    out = [centre]
    k = 1
    while len(out) < points:
        out.append(centre * STEP**k)
        if len(out) < points:
            out.append(centre / STEP**k)
        k += 1
    return [float(f"{lr:.4g}") for lr in out]


def result_path(out: Path, row: str, lr: float) -> Path:
    return out / f"{row}__lr{lr:g}.json"


def run_point(row: str, lr: float, cap: int | None, args: argparse.Namespace) -> dict:
    cfg = config_mod.load(ROOT / "configs" / f"{row}.yaml")
    # the gate on update norms (robust.max_norm_multiple) off: the rows recorded
    # before it existed ran without it, and at lr 0.464 full-batch it refuses
    # honest updates (benchmarks/results/table1/gate_lockout.txt)
    overrides: dict[str, object] = {
        "lr": lr,
        "runs_dir": str(args.runs),
        "robust.max_norm_multiple": None,
    }
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.eval_every:
        overrides["evaluation.every"] = args.eval_every
    if args.workers:
        overrides["workers"] = args.workers
    if args.threads:  # the run sets its processes' threads from its config
        overrides["threads"] = args.threads
    rounds = cfg.rounds if cap is None else min(cfg.rounds, cap)
    if args.max_rounds:
        rounds = min(rounds, args.max_rounds)
    overrides["rounds"] = rounds
    cfg = config_mod.override(cfg, overrides)
    # a stopped run of the same config resumes from its last checkpoint
    point = run_or_resume(cfg, {}, load_federated_data(cfg), args.progress)
    if point.status == "failed":  # SIGINT/SIGTERM: it checkpointed
        raise SystemExit(f"{row} lr={lr:g}: stopped; rerun the same command to resume it")
    with RunStore.open(point.run_dir, read_only=True) as store:
        s = store.summary() or {}
    return {
        "row": row,
        "lr": lr,
        "rounds_cap": rounds,
        "rounds_to_target": s["rounds_to_target"],
        "rounds_done": s["rounds_done"],
        "best_accuracy": s["best_accuracy"],
        "wall_seconds": s["wall_seconds"],  # over resumes
        "bytes_up": s["bytes_up"],
        "bytes_down": s["bytes_down"],
        "eval_every": cfg.evaluation.every,
        "threads": torch.get_num_threads(),
        "workers": cfg.workers,
        "run_dir": s.get("run_dir"),
        "signalled": point.stopped,  # a signal in the run's last round: it finished
    }


def load_results(out: Path) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {}
    for path in sorted(out.glob("*__lr*.json")):  # the grid points, not the E curves
        r = json.loads(path.read_text())
        results.setdefault(r["row"], []).append(r)
    return results


def best(points: list[dict]) -> dict | None:
    reached = [p for p in points if p["rounds_to_target"] is not None]
    return min(reached, key=lambda p: p["rounds_to_target"]) if reached else None


def report(results: dict[str, list[dict]]) -> str:
    width = max([22, *map(len, results)])
    head = (
        f"{'row':<{width}} {'paper':>6} {'ours':>7} {'ratio':>6} {'lr':>7} "
        f"{'grid (lr:rounds)':<44} {'speedup':>8} {'paper x':>8} {'wall s':>7}"
    )
    lines = [head, "-" * len(head)]
    fields = []
    for row in sorted(results, key=lambda r: (*split_row(r)[1:], split_row(r)[0], PAPER.get(r, 0))):
        points = sorted(results[row], key=lambda p: p["lr"])
        b = best(points)
        paper = PAPER.get(row)
        gridtxt = " ".join(
            f"{p['lr']:g}:{p['rounds_to_target']:.1f}"
            if p["rounds_to_target"] is not None
            else f"{p['lr']:g}:>{p['rounds_done']}"
            for p in points
        )
        prefix, model, split = split_row(row)
        sgd = best(results.get(f"{prefix}{model}_{split}_fedsgd", []))
        ours = b["rounds_to_target"] if b else None
        speed = f"{sgd['rounds_to_target'] / ours:.1f}x" if (sgd and ours) else "-"
        psgd = PAPER.get(f"{model}_{split}_fedsgd")
        pspeed = f"{psgd / paper:.1f}x" if (psgd and paper) else "-"
        wall = sum(p["wall_seconds"] for p in points)
        lrtxt = f"{b['lr']:g}" if b else "-"
        lines.append(
            f"{row:<{width}} {paper or '-':>6} {ours if ours is None else round(ours, 1)!s:>7} "
            f"{(f'{ours / paper:.2f}' if ours and paper else '-'):>6} "
            f"{lrtxt:>7} {gridtxt:<44} {speed:>8} {pspeed:>8} {wall:>7.0f}"
        )
        if ours is not None:
            fields.append(f"{row}_rounds={ours:.1f}")
        else:
            fields.append(f"{row}_rounds=nan")
        fields.append(f"{row}_paper={paper}")
    # the paper's rows with no saved point: named, not left out silently (a
    # prefixed row, e.g. scaled01_, is a variant of ours, not one of the paper's)
    missing = sorted(r for r in PAPER if r not in results and split_row(r)[0] == "")
    if missing:
        lines.append("not run: " + ", ".join(f"{r} (paper {PAPER[r]})" for r in missing))
    central = central_baseline()
    if central:
        lines.append(central)
    lines.append("RESULT " + " ".join(fields + shakespeare_fields(results)))
    return "\n".join(lines)


def shakespeare_fields(results: dict[str, list[dict]]) -> list[str]:
    """The Shakespeare keys: rounds of FedSGD and FedAvg E=1 B=10 by role, FedAvg's
    speedup over FedSGD by role and IID (the fastest FedAvg row), s/round."""
    if not any(r.startswith("shakespeare_") for r in results):
        return []

    def rounds(row: str) -> float:
        b = best(results.get(row, []))
        return b["rounds_to_target"] if b else math.nan

    def speedup(split: str) -> float:
        fedavg = [rounds(r) for r in results if r.startswith(f"shakespeare_{split}_e")]
        fastest = min((r for r in fedavg if not math.isnan(r)), default=math.nan)
        return rounds(f"shakespeare_{split}_fedsgd") / fastest

    points = results.get("shakespeare_noniid_e1_b10", [])
    per_round = [p["wall_seconds"] / p["rounds_done"] for p in points if p["rounds_done"]]
    common = [f for split in ("noniid", "iid") for f in common_target_fields(results, split)]
    return common + [
        f"shakespeare_fedsgd_rounds={rounds('shakespeare_noniid_fedsgd'):.1f}",
        f"shakespeare_fedavg_e1_b10_rounds={rounds('shakespeare_noniid_e1_b10'):.1f}",
        f"shakespeare_speedup={speedup('noniid'):.1f}",
        f"shakespeare_iid_speedup={speedup('iid'):.1f}",
        f"lstm_s_per_round={min(per_round, default=math.nan):.2f}",
    ]


def accuracy_curve(point: dict) -> list[tuple[int, float]]:
    """(round, test accuracy) of a finished point, read from its run's metrics."""
    path = Path(point.get("run_dir") or "") / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        (r["round_idx"] + 1, r["test_accuracy"]) for r in rows if r["test_accuracy"] is not None
    ]


def rounds_to(curve: list[tuple[int, float]], target: float) -> float:
    return next((float(k) for k, a in curve if a >= target), math.nan)


def common_target_fields(results: dict[str, list[dict]], split: str) -> list[str]:
    """When the rows stop short of 54%: the rounds each FedAvg row of ``split``
    needs to reach 20%, 30%, 40% and 50%, and its speedup over FedSGD there; where
    FedSGD did not reach a target in its rounds, the speedup is a lower bound (key
    ``..._min``: FedSGD's rounds run over FedAvg's rounds to the target), left out
    when below 1 (no bound)."""
    sgd = results.get(f"shakespeare_{split}_fedsgd", [])
    if not sgd:
        return []
    fields = []
    for target in (0.2, 0.3, 0.4, 0.5):
        sgd_rounds = min(rounds_to(accuracy_curve(p), target) for p in sgd)
        bound = math.isnan(sgd_rounds)
        ran = max(p["rounds_done"] for p in sgd)
        for row in sorted(r for r in results if r.startswith(f"shakespeare_{split}_e")):
            got = min(rounds_to(accuracy_curve(p), target) for p in results[row])
            tag = row.removeprefix(f"shakespeare_{split}_")
            pct = round(target * 100)
            fields.append(f"shakespeare_{split}_{tag}_rounds_to{pct}={got:.0f}")
            speed = (ran if bound else sgd_rounds) / got
            if not bound or speed >= 1:
                key = f"shakespeare_{split}_{tag}_speedup_at{pct}{'_min' if bound else ''}"
                fields.append(f"{key}={speed:.1f}")
    return fields


def e_curve(lr: float, epochs: list[int], rounds: int, args: argparse.Namespace) -> None:
    """The paper's large-E observation for the LSTM: FedAvg B=10 by role at E = each
    of ``epochs``, all at ``lr`` (the best of E=1), for ``rounds`` rounds; each
    curve of test accuracy saved as ``shakespeare_ecurve_E<E>.json`` under --out."""
    for e in epochs:
        path = args.out / f"shakespeare_ecurve_E{e}.json"
        if path.exists():
            continue
        cfg = config_mod.load(ROOT / "configs" / "shakespeare_noniid_e1_b10.yaml")
        fields = {"local_epochs": e, "lr": lr, "rounds": rounds, "target_accuracy": None}
        if args.threads:
            fields["threads"] = args.threads
        cfg = config_mod.override(cfg, {**fields, "runs_dir": str(args.runs)})
        if args.data_dir:
            cfg = config_mod.override(cfg, {"data_dir": args.data_dir})
        t0 = time.perf_counter()
        result = run(cfg, data=load_federated_data(cfg), progress=args.progress)
        curve = [
            [r.round_idx + 1, r.test_accuracy, r.test_loss]
            for r in result.rounds
            if r.test_accuracy is not None
        ]
        out = {"local_epochs": e, "lr": lr, "curve": curve, "seconds": time.perf_counter() - t0}
        path.write_text(json.dumps(out, indent=1))
        print(f"E={e} lr={lr:g}: last accuracy {curve[-1][1]:.4f}", flush=True)


def e_curve_report(out: Path) -> str:
    lines = []
    for path in sorted(out.glob("shakespeare_ecurve_E*.json"), key=lambda p: len(p.name)):
        r = json.loads(path.read_text())
        pts = " ".join(f"{k}:{a:.3f}" for k, a, _ in r["curve"][:: max(1, len(r["curve"]) // 8)])
        peak = max(a for _, a, _ in r["curve"])
        last = r["curve"][-1][1]
        lines.append(
            f"E={r['local_epochs']:<3} lr={r['lr']:g} peak {peak:.4f} last {last:.4f}  {pts}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", default="cnn_iid_e1_b10", help="comma-separated config names")
    p.add_argument("--grid", type=int, default=3, help="learning rates per row")
    p.add_argument("--lrs", help="explicit comma-separated learning rates (overrides --grid)")
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "results" / "table2",
        help="one JSON per (row, lr): tracked, so a later session resumes the grid",
    )
    p.add_argument("--data-dir")
    p.add_argument("--eval-every", type=int, help="override evaluation.every (coarser = faster)")
    p.add_argument("--max-rounds", type=int, help="cap every run (smoke checks)")
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument("--workers", type=int, help="worker processes per run (0: one per core)")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--report", action="store_true", help="only print the saved results")
    p.add_argument("--quick", action="store_true", help="2NN IID E=1 B=10, 5 rounds, 1 lr")
    p.add_argument(
        "--e-curve",
        type=float,
        metavar="LR",
        help="Shakespeare by role, FedAvg B=10 at E=1,5,20 and this lr (the best of E=1)",
    )
    p.add_argument("--e-curve-rounds", type=int, default=60)
    p.add_argument("--e-curve-epochs", default="1,5,20", help="the E values of --e-curve")
    args = p.parse_args(argv)
    args.runs = RUNS
    if args.quick:  # a fresh temporary directory: nothing kept, nothing reused
        args.rows, args.grid, args.max_rounds = "2nn_iid_e1_b10", 1, 5
        quick = _common.places("table2", quick=True)
        args.runs, args.out = quick.runs, quick.records
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.e_curve:
        epochs = [int(e) for e in args.e_curve_epochs.split(",")]
        e_curve(args.e_curve, epochs, args.e_curve_rounds, args)
        print(e_curve_report(args.out))
        return 0
    if not args.report:
        for row in args.rows.split(","):
            cfg = config_mod.load(ROOT / "configs" / f"{row}.yaml")
            lrs = [float(x) for x in args.lrs.split(",")] if args.lrs else grid(cfg.lr, args.grid)
            for lr in lrs:
                path = result_path(args.out, row, lr)
                if path.exists():
                    continue
                b = best(load_results(args.out).get(row, []))
                cap = math.ceil(b["rounds_to_target"]) + 1 if b else None
                r = run_point(row, lr, cap, args)
                signalled = r.pop("signalled")
                path.write_text(json.dumps(r, indent=1))
                print(
                    f"{row} lr={lr:g}: rounds_to_target={r['rounds_to_target']} "
                    f"best={r['best_accuracy']:.4f} ({r['wall_seconds']:.0f} s)",
                    flush=True,
                )
                if signalled:  # it finished in the signal's round; the next point waits
                    raise SystemExit(f"stopped by a signal after {row} lr={lr:g}")
    results = load_results(args.out)
    rows = set(args.rows.split(",")) if not args.report else set(results)
    print(report({k: v for k, v in results.items() if k in rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
