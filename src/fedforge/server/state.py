"""What the round loop carries from one round to the next, how it becomes a
checkpoint and back, and the two guards of a running loop: SIGINT/SIGTERM ask
it to stop after the current round, and a lock keeps a second process (a
resume started too early) out of a run directory that is being written."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from fedforge.core.errors import StopNow, StoreError
from fedforge.robust.typical_norm import remember
from fedforge.selection.history import History
from fedforge.server import optimizers
from fedforge.server.buffered_state import BufferedState
from fedforge.server.client_lr import keeps_norms
from fedforge.server.experiment import Experiment, client_tables
from fedforge.server.optimizers import ServerOptimizer
from fedforge.server.proxy import ProxyTuned, tuning_plan
from fedforge.store import (
    AnomalyRecord,
    Checkpoint,
    CheckpointError,
    ClientStateStore,
    RoundRecord,
)

if TYPE_CHECKING:
    from fedforge.config import Config
    from fedforge.server.collectors.base import Collected


@dataclass
class LoopState:
    """The round loop's state before round ``next_round``. Randomness needs no
    state: every draw derives from (seed, round, client, purpose)."""

    params: torch.Tensor
    optimizer: ServerOptimizer
    next_round: int = 0
    records: list[RoundRecord] = field(default_factory=list)
    eval_rounds: list[int] = field(default_factory=list)  # rounds done when evaluated
    eval_accuracy: list[float] = field(default_factory=list)
    rejected: list[tuple[int, int, str]] = field(default_factory=list)  # round, client, why
    skipped: list[tuple[int, str]] = field(default_factory=list)  # round, why (model unchanged)
    total_bytes: int = 0  # up + down so far
    seconds_before: float = 0.0  # wall time of earlier sessions of this run
    # per-client tables by name (EF residuals, SCAFFOLD controls); empty unless kept
    client_state: dict[str, ClientStateStore] = field(default_factory=dict)
    algorithm_state: dict[str, torch.Tensor] = field(default_factory=dict)  # SCAFFOLD's c
    privacy: dict[str, Any] = field(default_factory=dict)  # e.g. the adaptive clip norm
    # the low-cosine streak of the drift warning (server/diagnostics.py), checkpointed
    diagnostics: dict[str, Any] = field(default_factory=dict)
    # rows of the run store's per-round tables (client_eval, diagnostics, ...) of the
    # round just run, written by the loop with the round; never checkpointed
    outputs: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    # evaluation.initial: the initial model's test accuracy and loss (checkpointed)
    initial_eval: tuple[float, float] | None = None
    # the norms of the updates taken in the last robust.norm_window rounds that
    # took any, oldest first: robust.max_norm_multiple's reference (checkpointed)
    update_norms: list[list[float]] = field(default_factory=list)
    # the same rounds' norms of those updates before their clients' clip, as the
    # clients reported them: communication.clip_multiple's reference (checkpointed)
    clip_norms: list[list[float]] = field(default_factory=list)
    # what the server knows of each client asked so far: the selection policy's
    # input (selection/history.py), kept by the selection hook (checkpointed)
    selection: History = field(default_factory=History)
    # buffered asynchronous aggregation: the clock and the clients at work
    # (checkpointed); None in synchronous rounds
    buffered: BufferedState | None = None
    # the virtual clock (systems/): each round's end, in seconds of virtual time
    # from the run's start (checkpointed; empty without the clock)
    virtual_s: list[float] = field(default_factory=list)

    @property
    def virtual_now(self) -> float:
        """The virtual time at the start of round ``next_round``."""
        return self.virtual_s[-1] if self.virtual_s else 0.0

    @classmethod
    def fresh(cls, exp: Experiment) -> LoopState:
        tables = client_tables(exp)
        for table in tables.values():
            table.clear()  # a new run starts from zero residuals and controls
        optimizer = server_optimizer(exp)
        state = cls(exp.initial_params.clone(), optimizer, client_state=tables)
        server = exp.algorithm.server
        if server is not None:
            state.algorithm_state = server.initial_state(exp.spec.size, exp.initial_params.dtype)
        if exp.privacy is not None:
            state.privacy = exp.privacy.initial_state()
        if exp.cfg.asynchronous.buffered:
            state.buffered = BufferedState()
        return state

    def remember_norms(self, collected: Collected, cfg: Config) -> None:
        """After a round, where a bound relative to recent norms is set
        (``client_lr.keeps_norms``): the norms of the updates it took as decoded
        (``update_norms``: the refusal bound's) and before their clients' clip
        (``clip_norms``: the clip bound's), the last ``robust.norm_window`` rounds
        that took any of each kept."""
        if not keeps_norms(cfg):
            return
        window = cfg.robust.norm_window
        self.update_norms = remember(self.update_norms, collected.taken_norms(), window)
        self.clip_norms = remember(self.clip_norms, collected.taken_clip_norms(), window)

    def anomalies(self, round_idx: int) -> list[AnomalyRecord]:
        """The refused updates and the skip (client None) of one round, for the store."""
        found = [AnomalyRecord(r, c, why) for r, c, why in self.rejected if r == round_idx]
        return found + [AnomalyRecord(r, None, why) for r, why in self.skipped if r == round_idx]

    def checkpoint(self, session_seconds: float) -> Checkpoint:
        loop: dict[str, Any] = {
            "eval_rounds": self.eval_rounds,
            "eval_accuracy": self.eval_accuracy,  # JSON floats round-trip exactly
            "rejected": [list(r) for r in self.rejected],
            "skipped": [list(r) for r in self.skipped],
            "total_bytes": self.total_bytes,
            "wall_seconds": self.seconds_before + session_seconds,
            "privacy": self.privacy,
            "diagnostics": self.diagnostics,
            "update_norms": self.update_norms,  # finite floats: JSON round-trips them
            "clip_norms": self.clip_norms,
            "selection": self.selection.state_dict(),
        }
        if self.virtual_s:
            loop["virtual_s"] = self.virtual_s  # finite floats: JSON round-trips them
        if self.initial_eval is not None:
            loop["initial_eval"] = list(self.initial_eval)
        in_flight: dict[str, torch.Tensor] = {}
        if self.buffered is not None:
            loop["buffered"], in_flight = self.buffered.state_dict()
        return Checkpoint(
            self.next_round,
            self.params,
            self.optimizer.state_dict(),
            loop,
            torch.get_rng_state(),
            algorithm_state=dict(self.algorithm_state),
            in_flight=in_flight,
        )

    @classmethod
    def from_checkpoint(
        cls,
        exp: Experiment,
        ckpt: Checkpoint,
        stored: list[RoundRecord],
        client_state: dict[str, ClientStateStore] | None = None,
    ) -> LoopState:
        """Rebuild the state from a checkpoint and the rounds the store holds before it."""
        spec = (exp.spec.size,)
        if tuple(ckpt.params.shape) != spec or ckpt.params.dtype != exp.initial_params.dtype:
            raise CheckpointError(
                f"checkpoint {ckpt.path} holds params {tuple(ckpt.params.shape)} "
                f"{ckpt.params.dtype}; the run's model needs {spec} {exp.initial_params.dtype}"
            )
        records = [r for r in stored if r.round_idx < ckpt.next_round]
        if [r.round_idx for r in records] != list(range(ckpt.next_round)):
            raise CheckpointError(
                f"the run store lacks some of the {ckpt.next_round} rounds before checkpoint "
                f"{ckpt.path}; it holds rounds {[r.round_idx + 1 for r in records]}"
            )
        optimizer = server_optimizer(exp)
        optimizer.load_state_dict(ckpt.optimizer_state)
        if ckpt.torch_rng_state is not None:  # nothing reads it; restored for completeness
            torch.set_rng_state(ckpt.torch_rng_state)
        loop = ckpt.loop
        return cls(
            params=ckpt.params.clone(),
            optimizer=optimizer,
            next_round=ckpt.next_round,
            records=records,
            eval_rounds=[int(r) for r in loop["eval_rounds"]],
            eval_accuracy=[float(a) for a in loop["eval_accuracy"]],
            rejected=[(int(r), int(c), str(w)) for r, c, w in loop["rejected"]],
            skipped=[(int(r), str(w)) for r, w in loop.get("skipped", [])],
            total_bytes=int(loop["total_bytes"]),
            seconds_before=float(loop["wall_seconds"]),
            client_state=client_state if client_state is not None else {},
            algorithm_state=_algorithm_state(exp, ckpt),
            privacy=dict(loop.get("privacy", {})),
            diagnostics=dict(loop.get("diagnostics", {})),
            initial_eval=_initial_eval(loop.get("initial_eval")),
            update_norms=[[float(x) for x in r] for r in loop.get("update_norms", [])],
            clip_norms=[[float(x) for x in r] for r in loop.get("clip_norms", [])],
            selection=History.from_state(loop.get("selection")),
            buffered=(
                BufferedState.from_state(loop.get("buffered"), ckpt.in_flight)
                if exp.cfg.asynchronous.buffered
                else None
            ),
            virtual_s=[float(x) for x in loop.get("virtual_s", [])][: ckpt.next_round],
        )


def server_optimizer(exp: Experiment) -> ServerOptimizer:
    """The run's server optimizer, followed by SGD on the proxy set when it tunes."""
    optimizer = optimizers.from_config(exp.cfg)
    if exp.proxy is None or not exp.cfg.proxy.tunes:
        return optimizer
    loss_fn, plan = exp.algorithm.loss_fn, tuning_plan(exp.cfg)
    seed, device = exp.cfg.seed, exp.device
    return ProxyTuned(optimizer, exp.model, exp.spec, exp.proxy, plan, loss_fn, seed, device)


def _initial_eval(stored: Any) -> tuple[float, float] | None:
    """``evaluation.initial``'s accuracy and loss as a checkpoint stored them, if it did."""
    if not isinstance(stored, list) or len(stored) != 2:
        return None
    return float(stored[0]), float(stored[1])


def _algorithm_state(exp: Experiment, ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """The algorithm's server state from a checkpoint, checked against what it keeps."""
    server = exp.algorithm.server
    want = server.initial_state(exp.spec.size, exp.initial_params.dtype) if server else {}
    got = ckpt.algorithm_state
    if set(got) != set(want):
        raise CheckpointError(
            f"checkpoint {ckpt.path} holds algorithm state {sorted(got)}; the run's "
            f"algorithm '{exp.algorithm.name}' keeps {sorted(want)}"
        )
    for name, value in want.items():
        if got[name].shape != value.shape or got[name].dtype != value.dtype:
            raise CheckpointError(
                f"checkpoint {ckpt.path} holds algorithm state '{name}' of "
                f"{tuple(got[name].shape)} {got[name].dtype}; expected "
                f"{tuple(value.shape)} {value.dtype}"
            )
    return {k: v.clone() for k, v in got.items()}


def aggregator_state(aggregator: object) -> dict[str, torch.Tensor]:
    """What an aggregator carries from round to round (an adaptive norm bound's
    recent norms, centred clipping's centre), for the checkpoint; stateless
    aggregators have no ``state_dict``."""
    state_dict = getattr(aggregator, "state_dict", None)
    return dict(state_dict()) if state_dict is not None else {}


def load_aggregator_state(aggregator: object, ckpt: Checkpoint) -> None:
    """Put a checkpoint's aggregator state back; refuse one that does not fit."""
    load = getattr(aggregator, "load_state_dict", None)
    if load is None:
        if ckpt.aggregator_state:
            raise CheckpointError(
                f"checkpoint {ckpt.path} holds aggregator state {sorted(ckpt.aggregator_state)}; "
                f"the run's aggregator '{getattr(aggregator, 'name', aggregator)}' keeps none"
            )
        return
    try:
        load(ckpt.aggregator_state)
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {ckpt.path}: aggregator state: {exc}") from None


class StopSignals:
    """While active, SIGINT and SIGTERM set :attr:`signum` (the loop finishes the
    round, checkpoints and returns); a second signal raises :class:`StopNow` (a
    KeyboardInterrupt) at once. The previous handlers come back on exit. Outside
    the main thread, or when disabled, it does nothing (signals keep their usual
    effect)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def __enter__(self) -> StopSignals:
        if self.enabled:
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise StopNow(signum)
        self.signum = signum
        # os.write: print() is not safe inside a signal handler (buffered I/O reentry)
        os.write(
            2,
            f"\nfedforge: {signal.Signals(signum).name}: finishing this round, then "
            "checkpointing (send it again to stop now)\n".encode(),
        )


# The lock files this process holds open. A forked child (a worker of the pool
# engine) would share each open file and so the lock: were the server killed, a
# surviving child would keep the run locked. Children close their copies at once
# (close, not unlock: unlocking would drop the parent's lock too).
_HELD_LOCKS: set[int] = set()


def _close_inherited_locks() -> None:
    for fd in _HELD_LOCKS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/lock`` for as long as a loop writes the
    run; the kernel drops it when the process dies, even by SIGKILL (processes it
    forks do not inherit it)."""

    NAME = "lock"

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / self.NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock, or raise StoreError when another process holds it or
        the run's folder cannot be written (read-only, another user's)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(
                f"run '{self.path.parent}' cannot be written here ({exc.strerror}): it can "
                "be listed and shown, not resumed"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"run '{self.path.parent}' is being written by another process; "
                "wait for it to stop before resuming"
            ) from None
        self._fd = fd
        _HELD_LOCKS.add(fd)
        return self

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            _HELD_LOCKS.discard(self._fd)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
