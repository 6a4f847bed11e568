"""Processes of a deployment benchmark on loopback (benchmarks/deployment.py): a
``fedforge server`` and its ``fedforge client`` processes with mutual TLS, and the
simulator as ``fedforge run``, each in a process of its own whose peak RSS is read
when it is reaped (``os.wait4``), with its output in a log file. A ``Lab`` kills
whatever it started and is still alive when it closes; every wait is bounded and
fails with the tail of the logs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fedforge

FEDFORGE = [sys.executable, "-m", "fedforge.cli"]
SRC = str(Path(fedforge.__file__).resolve().parents[1])  # this fedforge's src folder


def _die_with_parent() -> None:
    """In the child before it runs: SIGKILL when the benchmark dies, however it
    dies (Linux's PR_SET_PDEATHSIG), so that no process outlives it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class LabError(RuntimeError):
    """A process failed or a wait ran out; the message has the logs' tails."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process: this fedforge first on PYTHONPATH."""
    env = dict(os.environ)
    rest = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([SRC, rest]) if rest else SRC
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("FEDFORGE_TEST_EXIT_AT", None)
    env.update(extra or {})
    return env


def check_import() -> str:
    """The fedforge a child process imports; LabError when it is not this one."""
    code = "import fedforge, pathlib; print(pathlib.Path(fedforge.__file__).resolve())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120
    )
    got = out.stdout.strip()
    if not got.startswith(SRC):
        raise LabError(f"child processes import fedforge from {got!r}, not {SRC}: {out.stderr}")
    return got


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    maxrss_kib: int | None = None  # the peak RSS, once reaped
    expect_exit: bool = False  # a process told to die (FEDFORGE_TEST_EXIT_AT)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    out.append(json.loads(line))
        return out

    def event(self, name: str) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events()) if e.get("event") == name), None)

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {self.name} ({self.log}), last {len(text)} lines:\n" + "\n".join(text)

    def poll(self) -> int | None:
        """The exit status once it ended (reaped here, with its peak RSS)."""
        if self.popen.returncode is None:
            try:
                pid, status, usage = os.wait4(self.popen.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: no RSS figure
                return self.popen.poll()
            if pid == 0:
                return None
            self.popen.returncode = os.waitstatus_to_exitcode(status)
            self.maxrss_kib = usage.ru_maxrss
        return self.popen.returncode

    def wait(self, timeout: float, others: Sequence[Proc] = ()) -> int:
        """Its exit status; LabError when it runs past ``timeout`` or one of
        ``others`` failed first."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            code = self.poll()
            if code is not None:
                return code
            for o in others:
                c = o.poll()
                if c not in (None, 0) and not o.expect_exit:
                    raise LabError(f"{o.name} exited {c}\n{o.tail()}\n{self.tail()}")
            time.sleep(0.2)
        raise LabError(f"{self.name} still running after {timeout:.0f} s\n{self.tail()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            with contextlib.suppress(LabError):
                self.wait(30)


@dataclass
class Lab:
    """The processes of one benchmark, in ``root``; ``close`` kills the living."""

    root: Path
    certs: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.root / f"{name}-{time.monotonic_ns()}.log"
        with log.open("wb") as f:
            p = subprocess.Popen(
                [*FEDFORGE, *args],
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
                env=child_env(env),
                cwd=self.root,
            )
        proc = Proc(name, p, log)
        self.procs.append(proc)
        return proc

    def server(
        self, config: Path | None, runs: Path, port: int = 0, resume: Path | None = None
    ) -> tuple[Proc, int]:
        """A server listening with mutual TLS; its port (read from its log)."""
        # the lab lays its clients out per part: any process may host any id
        args = ["server", "--port", str(port), "-q", "--certs", str(self.certs), "--any-member"]
        args += ["--resume", str(resume)] if resume else ["--config", str(config)]
        proc = self.start("server", [*args, "--runs-dir", str(runs)] if not resume else args)
        end = time.monotonic() + 180
        while time.monotonic() < end:
            e = proc.event("listening")
            if e is not None:
                return proc, int(e["port"])
            if proc.poll() is not None:
                raise LabError(f"the server exited {proc.poll()}\n{proc.tail()}")
            time.sleep(0.1)
        raise LabError(f"the server did not listen within 180 s\n{proc.tail()}")

    def clients(
        self,
        port: int,
        groups: list[list[int]],
        heartbeat_s: float,
        exit_at: dict[int, str],
        data: Path | None = None,
    ) -> list[Proc]:
        """Process k hosts ``groups[k]`` as ``client-k``; ``exit_at``: k -> ROUND:PHASE;
        ``data``: the clients' own examples, ``data/<id>/`` each (``--data``),
        instead of the simulator's partition."""
        out = []
        for k, ids in enumerate(groups):
            args = ["client", "--server", f"127.0.0.1:{port}"]
            if data is None:
                args += ["--clients", id_list(ids)]
            else:
                # one id: --data names the client's own folder; several: the
                # folder of their folders <id>/ (data/folder.py's rule)
                folder = data / str(ids[0]) if len(ids) == 1 else data
                args += ["--data", str(folder), "--client-id", id_list(ids)]
            args += ["--name", f"client-{k}", "--certs", str(self.certs)]
            args += ["--heartbeat-s", str(heartbeat_s), "--give-up-s", "120"]
            env = {"FEDFORGE_TEST_EXIT_AT": exit_at[k]} if k in exit_at else None
            proc = self.start(f"client-{k}", args, env)
            proc.expect_exit = k in exit_at
            out.append(proc)
        return out

    def close(self) -> None:
        for p in self.procs:
            p.kill()


def mib(kib: int | None) -> float | None:
    return None if kib is None else kib / 1024


def id_list(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the --clients syntax)."""
    parts, ids = [], sorted(ids)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def store_file(runs: Path) -> Path | None:
    """The run's store once its directory has its final (not hidden) name."""
    found = [p for p in runs.glob("*/store.sqlite") if not p.parent.name.startswith(".")]
    return found[0] if found else None


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` on a store another process may be writing (retried while locked)."""
    for _ in range(100):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
                return con.execute(sql).fetchall()
        except sqlite3.OperationalError:
            time.sleep(0.05)
    raise LabError(f"cannot read {db}")


def wait_rows(runs: Path, server: Proc, sql: str, ok: Any, timeout: float) -> Any:
    """Poll ``sql`` on the run's store until ``ok(rows)`` holds; the rows then."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        db = store_file(runs)
        if db is not None:
            rows = query(db, sql)
            if ok(rows):
                return rows
        if server.poll() is not None:
            raise LabError(f"the server exited {server.poll()}\n{server.tail()}")
        time.sleep(0.05)
    raise LabError(f"waited {timeout:.0f} s for the store ({sql})\n{server.tail()}")


def round_seconds(db: Path) -> dict[int, float]:
    return {int(r): float(s) for r, s in query(db, "SELECT round_idx, seconds FROM rounds")}


def participants(db: Path) -> dict[int, int]:
    rows = query(db, "SELECT round_idx, COUNT(*) FROM client_rounds GROUP BY round_idx")
    return {int(r): int(n) for r, n in rows}


def summary(db: Path) -> dict[str, Any]:
    (text,) = query(db, "SELECT summary_json FROM runs")[0]
    return json.loads(text) if text else {}


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes``, sections merged key by key."""
    out = dict(base)
    for k, v in changes.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def mean_round(db: Path) -> float:
    """Mean ``seconds`` of the rounds after the first (the first if it is alone)."""
    secs = round_seconds(db)
    later = [s for r, s in secs.items() if r >= 1] or list(secs.values())
    return sum(later) / len(later)


def split(ids: list[int], parts: int) -> list[list[int]]:
    """``ids`` in ``parts`` contiguous groups of near-equal size (none empty)."""
    q, r = divmod(len(ids), parts)
    out, i = [], 0
    for k in range(parts):
        n = q + (k < r)
        out.append(ids[i : i + n])
        i += n
    return [g for g in out if g]


def drop_layout(n: int, procs: int, cohort: list[int], k: int) -> list[list[int]]:
    """Clients 0..n-1 over ``procs`` processes, the first hosting ``k`` of ``cohort``
    (filled up to its share with clients outside it), the others the rest."""
    per = n // procs
    outside = [c for c in range(n) if c not in set(cohort)]
    first = sorted(cohort[:k] + outside[: max(0, per - k)])
    return [first, *split([c for c in range(n) if c not in set(first)], procs - 1)]
