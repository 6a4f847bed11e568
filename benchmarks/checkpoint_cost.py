"""Checkpoint cost of a large per-client table: incremental (segments.py) against
writing every row at every checkpoint (the format before session 12), side by side.

    python benchmarks/checkpoint_cost.py            # 2,000 clients x 250k floats (2 GB)
    python benchmarks/checkpoint_cost.py --quick    # 400 clients x 50k floats

A file-backed table (``MemmapStateStore``, as a run past the 1 GiB memory budget
keeps) of N clients x P float32; every client is written once first (a
federation whose every client has state, the worst case for full checkpoints),
then rounds of ``--cohort`` clients each rewrite their rows, with a checkpoint
every ``--every`` rounds. The same schedule runs twice in one process, once
incremental and once with every checkpoint written in full (the chain dropped
before each), alternating which goes first per checkpoint. Reported: seconds and
bytes written per checkpoint (median over checkpoints), their ratios, and the
disk used by the two kept checkpoints. Loading the newest is timed for both and
its rows checked equal to the table's.

Last line: ``RESULT full_s= incremental_s= speedup= bytes_ratio= disk_ratio=``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedforge.store import Checkpoint, MemmapStateStore, load_checkpoint, save_checkpoint, segments


def _disk_bytes(root: Path) -> int:
    """Bytes of distinct files under ``root`` (a hard-linked file counted once)."""
    seen: dict[int, int] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            st = os.stat(Path(dirpath) / name)
            seen[st.st_ino] = st.st_size
    return sum(seen.values())


def _written_bytes(path: Path, before: set[str]) -> int:
    """Bytes of the files of checkpoint ``path`` that the previous one did not
    have (segments are named by the round that wrote them; inodes are reused)."""
    return sum(p.stat().st_size for p in path.iterdir() if p.name not in before)


def _newest_files(root: Path) -> set[str]:
    found = sorted((root / "checkpoints").glob("round-*")) if root.exists() else []
    return {p.name for p in found[-1].iterdir()} if found else set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", type=int)
    parser.add_argument("--size", type=int, help="floats per client")
    parser.add_argument("--cohort", type=int, default=20)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--checkpoints", type=int, default=4)
    args = parser.parse_args()
    n = args.clients or (400 if args.quick else 2000)
    p = args.size or (50_000 if args.quick else 250_000)
    work = Path(tempfile.mkdtemp(prefix="fedforge-ckpt-bench-"))
    try:
        tables = {
            mode: MemmapStateStore(n, p, work / f"table-{mode}", torch.float32)
            for mode in ("incremental", "full")
        }
        gen = torch.Generator().manual_seed(0)
        for start in range(0, n, 100):  # every client has state
            ids = list(range(start, min(n, start + 100)))
            rows = torch.randn(len(ids), p, generator=gen)
            for table in tables.values():
                table.scatter(ids, rows)
        rng = np.random.default_rng(0)
        seconds: dict[str, list[float]] = {m: [] for m in tables}
        written: dict[str, list[int]] = {m: [] for m in tables}
        for c in range(args.checkpoints + 1):  # the first is the full base of both
            for _ in range(args.every if c else 0):
                ids = sorted(rng.choice(n, args.cohort, replace=False).tolist())
                rows = torch.randn(len(ids), p, generator=gen)
                for table in tables.values():
                    table.scatter(ids, rows)
            order = list(tables) if c % 2 else list(reversed(tables))
            for mode in order:
                if mode == "full":
                    segments._CHAINS.pop(tables[mode], None)  # as before: every row
                root = work / f"run-{mode}"
                before = _newest_files(root)
                t0 = time.perf_counter()
                path = save_checkpoint(root, Checkpoint(c + 1, torch.zeros(3)), tables[mode])
                if c:
                    seconds[mode].append(time.perf_counter() - t0)
                    written[mode].append(_written_bytes(path, before))
        disk = {m: _disk_bytes(work / f"run-{m}" / "checkpoints") for m in tables}
        load_s = {}
        for mode, table in tables.items():
            fresh = MemmapStateStore(n, p, work / f"load-{mode}", torch.float32)
            t0 = time.perf_counter()
            load_checkpoint(
                work / f"run-{mode}" / "checkpoints" / f"round-{args.checkpoints + 1:06d}", fresh
            )
            load_s[mode] = time.perf_counter() - t0
            probe = sorted(rng.choice(n, 20, replace=False).tolist())
            assert torch.equal(fresh.gather(probe), table.gather(probe)), mode
            fresh.close()
        for table in tables.values():
            table.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gb = n * p * 4 / 1e9
    print(
        f"table {n} clients x {p} floats ({gb:.2f} GB), cohort {args.cohort}, "
        f"checkpoint every {args.every} rounds, {args.checkpoints} checkpoints timed"
    )
    head = ("s/checkpoint", "MB written", "disk MB (2 kept)", "load s")
    print(f"{'':12s} {head[0]:>13s} {head[1]:>11s} {head[2]:>17s} {head[3]:>7s}")
    med = {m: statistics.median(seconds[m]) for m in seconds}
    mb = {m: statistics.median(written[m]) / 1e6 for m in written}
    for m in ("full", "incremental"):
        print(f"{m:12s} {med[m]:13.2f} {mb[m]:11.1f} {disk[m] / 1e6:17.1f} {load_s[m]:7.2f}")
    print(
        f"RESULT full_s={med['full']:.2f} incremental_s={med['incremental']:.2f} "
        f"speedup={med['full'] / med['incremental']:.1f} "
        f"bytes_ratio={mb['full'] / mb['incremental']:.1f} "
        f"disk_ratio={disk['full'] / disk['incremental']:.2f}"
    )


if __name__ == "__main__":
    main()
