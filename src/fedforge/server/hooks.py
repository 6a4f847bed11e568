"""Round hooks: what acts around a round without changing what it computes
(privacy accounting, drift diagnostics, the commit of client state, a
deployment's rollout, alerts, a user's logging, custom stopping rules'
bookkeeping).

A run's hooks are one ordered list (``builtin_hooks.run_hooks``, built by
``fedforge.run`` / ``resume`` and handed to the round loop):

1. ``privacy``: the round's adaptive clip norm published at its start, the
   next one computed at its end, and the round's participation for the
   accountant (``PrivacyParts``);
2. ``diagnostics``: the drift figures of the updates the round took;
3. ``client_state``: the algorithm's per-client state (SCAFFOLD's c_k+) kept for
   the clients whose updates the model took;
4. ``selection``: what the server knows of each client asked (``LoopState.selection``,
   selection/history.py), the selection policy's input for the next cohorts;
5. ``rollout``, a deployment's only (``fedforge server`` adds it;
   transport/rollout.py): at an upload round's start the clients that joined
   since evaluate the global model on their own data (cold start: the
   ``cold_start`` rows), a canary version is judged when due, the serving
   version is sent to the clients that lack it; it is the run's one gate (below);
6. ``alerts``: the config's alert rules stepped on each round as the run store
   recorded it, their actions run, the ``alerts`` rows written (alerts/monitor.py);
7. the user's hooks, in the order given to ``fedforge.run`` / ``resume``.

The round calls every hook, in that order, at each point of its life:

- ``round_start(info)``: every round, before its clients are asked (after its
  cohort is drawn and its tasks and payload made); also a round inside an
  upload period (``info.kind == 'local'``: its cohort trains, nothing travels)
  and a round skipped before anything was sent (``'short'``: too few clients
  connected);
- ``upload(info, client_id, taken, reason)``: each refused upload as it is
  refused (``taken`` False, ``reason`` the line the run store keeps), then each
  upload the model took after the server step (``taken`` True, ``reason``
  None), in client order;
- ``evaluated(info, accuracy, loss)``: when the round's model is evaluated on
  the test set (``evaluation.every``, and the last round);
- ``round_end(info, end)``: every round, with its record (the row the run store
  keeps) and whose updates the model took;
- ``recorded(info)``: every round of a run with a run store (``info.store``),
  once the round's rows are in it, before its checkpoint;
- ``run_end(result)``: once, when the rounds stop (finished, at the target, out of
  privacy budget, stalled, or stopped by a signal after its checkpoint).

Contract: a user's hooks observe. They return nothing, and what the round
computes (cohort, who is asked, model, record) is the same with or without them
(the built-in ``client_state`` and ``selection`` keep what later rounds read); a
hook that raises fails the run (resumable from its last checkpoint). A hook keeps
its own state; state that must survive a resume is what ``state_dict`` returns
(plain JSON data: numbers, strings, lists, dicts with string keys; floats
round-trip exactly), written with every checkpoint under the hook's ``name``
and handed back to ``load_state_dict`` before the first resumed round. A
resumed run runs again the rounds recorded after its checkpoint: a hook sees
them again, from the state it had at that checkpoint, and ends as an
uninterrupted run's would. Names are unique within a run.

The one way a hook acts on the round is a :class:`RoundGate`, and only the
package's own hooks are gates (``run_hooks(gates=...)``: the deployment's
rollout; a user's hook is never asked, whatever methods it has): after every
hook's ``round_start`` of an upload round, each gate names which of the round's
cohort may be asked anything (to train, or a protocol message); the round asks
only those, and the others count as dropouts (they answer nothing). Rows a
built-in hook writes for the run store go to ``info.state.outputs`` (recorded
with the round) or, after ``recorded``, to ``info.store`` itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

from fedforge.core.errors import ConfigError, FedforgeError

if TYPE_CHECKING:
    from fedforge.report.progress import Progress
    from fedforge.server.diagnostics import RoundDiagnostics
    from fedforge.server.experiment import Experiment
    from fedforge.server.result import RunResult
    from fedforge.server.state import LoopState
    from fedforge.store import ClientRecord, RoundRecord, RunStore

RoundKind = Literal["upload", "local", "short"]


class HookError(FedforgeError):
    """A round hook broke its contract (wrote the model, kept state JSON cannot
    hold): the run fails, resumable from its last checkpoint."""


@dataclass
class RoundInfo:
    """What every hook call of one round is told. ``state`` is the loop's state
    (read it; the built-in hooks keep their checkpointed state in it)."""

    exp: Experiment
    state: LoopState
    bar: Progress  # the run's progress bar: ``bar.write`` prints a line beside it
    round_idx: int
    start: int  # the first round of the upload period (its cohort and plan)
    kind: RoundKind  # 'upload': updates travel; 'local', 'short': see the module
    # the sampled clients (empty in a short round): the hooks' copy, the round keeps its own
    cohort: list[int]
    # those given a task (stragglers dropped; empty unless 'upload'); the gates may
    # leave some of them unasked (a deployment's clients not cold-started yet)
    trainers: list[int]
    params: torch.Tensor  # the global model the round starts from (not to be written)
    # the round's drift figures, set by the diagnostics hook at the round's start
    # and fed by the round's collector with each update it takes
    diagnostics: RoundDiagnostics | None = None
    # the run's store (None: a run without one), to read; the package's own hooks
    # keep what is not a round's row there (a deployment's model versions, alerts)
    store: RunStore | None = None


@dataclass(frozen=True)
class RoundEnd:
    """How a round ended."""

    record: RoundRecord  # the round's row in the run store
    used: list[int]  # the clients whose updates the model took, sorted
    applied: bool  # the server step was taken (False: skipped, the model unchanged)
    arrived: list[int] = field(default_factory=list)  # every upload that arrived
    # the clients whose updates the server saw (under secure aggregation: those in
    # the revealed sum): what the privacy accountant counts
    seen: list[int] = field(default_factory=list)
    # the run store's rows of the clients whose updates the model took (their
    # example counts and reported training losses)
    clients: list[ClientRecord] = field(default_factory=list)
    # the seconds each arrived upload took from the round's start, where the round
    # measured them (the simulator's virtual clock)
    durations: dict[int, float] = field(default_factory=dict)


class RoundHook(Protocol):
    """One feature acting around the round (see the module for when each method
    is called and the contract). Subclass it to take the no-op defaults and
    override what the hook needs."""

    name: str  # unique within a run: the key of its state in checkpoints

    def round_start(self, info: RoundInfo) -> None:
        return None

    def upload(self, info: RoundInfo, client_id: int, taken: bool, reason: str | None) -> None:
        return None

    def evaluated(self, info: RoundInfo, accuracy: float, loss: float) -> None:
        return None

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        return None

    def recorded(self, info: RoundInfo) -> None:
        return None

    def run_end(self, result: RunResult) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class RoundGate(RoundHook, Protocol):
    """A package's own hook that also says which clients a round may ask (see the
    module): the one way a hook acts on what the round computes."""

    def askable(self, info: RoundInfo, ids: Sequence[int]) -> Iterable[int]:
        """Those of ``ids`` (the round's cohort) that may be asked this round."""
        ...


class RoundHooks:
    """The run's hooks in order; each call goes to every hook in turn. ``gates``:
    the package's own hooks (also in ``hooks``) whose word on who is asked the
    round takes (:meth:`askable`); only ``builtin_hooks.run_hooks`` names them."""

    def __init__(self, hooks: Iterable[RoundHook] = (), gates: Iterable[RoundGate] = ()) -> None:
        self.hooks: tuple[RoundHook, ...] = tuple(hooks)
        self.gates: tuple[RoundGate, ...] = tuple(gates)
        self.current: RoundInfo | None = None  # the round last started: ``recorded``'s
        names = [h.name for h in self.hooks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(
                f"round hook name(s) {twice} used more than once; each hook of a run "
                "needs its own name (its state is checkpointed under it)"
            )

    def __iter__(self) -> Iterator[RoundHook]:
        return iter(self.hooks)

    def names(self) -> list[str]:
        return [h.name for h in self.hooks]

    def extended(self, more: Iterable[RoundHook]) -> RoundHooks:
        """These hooks, then ``more`` (hooks only: the gates stay these ones)."""
        return RoundHooks([*self.hooks, *more], self.gates)

    def _each(self, info: RoundInfo, call: Callable[[RoundHook], None]) -> None:
        """``call`` each hook in turn; a hook that wrote the round's model (which
        hooks only read) fails the run, in one line naming it."""
        for h in self.hooks:
            before = info.params._version
            call(h)
            if info.params._version != before:
                raise HookError(
                    f"round hook {h.name!r} wrote the round's model (RoundInfo.params) in "
                    f"round {info.round_idx + 1}: hooks observe; copy it (.clone()) to change it"
                )

    def round_start(self, info: RoundInfo) -> None:
        self.current = info
        self._each(info, lambda h: h.round_start(info))

    def askable(self, info: RoundInfo, ids: Sequence[int]) -> set[int] | None:
        """Those of ``ids`` every gate lets the round ask (None: no gate, all of them)."""
        if not self.gates:
            return None
        allowed = set(ids)
        for gate in self.gates:
            allowed &= {int(c) for c in gate.askable(info, sorted(allowed))}
        return allowed

    def upload(self, info: RoundInfo, client_id: int, taken: bool, reason: str | None) -> None:
        self._each(info, lambda h: h.upload(info, client_id, taken, reason))

    def taken(self, info: RoundInfo, used: Sequence[int]) -> None:
        for c in sorted(used):
            self.upload(info, c, True, None)

    def evaluated(self, info: RoundInfo, accuracy: float, loss: float) -> None:
        self._each(info, lambda h: h.evaluated(info, accuracy, loss))

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        self._each(info, lambda h: h.round_end(info, end))

    def recorded(self) -> None:
        """The round last started is in the run store (``info.store``)."""
        info = self.current
        if info is not None and info.store is not None:
            self._each(info, lambda h: h.recorded(info))

    def run_end(self, result: RunResult) -> None:
        for h in self.hooks:
            h.run_end(result)

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Each stateful hook's state by its name (for the checkpoint); a state
        that would not come back from JSON as it is (a tensor, an integer key, a
        tuple) fails the run, in one line naming the hook, before it is saved."""
        out = {h.name: s for h in self.hooks if (s := h.state_dict())}
        for name, s in out.items():
            try:
                same = _same(json.loads(json.dumps(s)), s)
            except (TypeError, ValueError) as exc:
                raise HookError(
                    f"round hook {name!r}: its state_dict() is not JSON: {exc}"
                ) from None
            if not same:
                raise HookError(
                    f"round hook {name!r}: its state_dict() would not come back from the "
                    "checkpoint as it is (JSON keeps str keys, lists, numbers, strings, "
                    "bools and null: no int keys, tuples or tensors)"
                )
        return out

    def load_state_dict(self, state: dict[str, dict[str, Any]]) -> None:
        """Put a checkpoint's hook states back; a hook absent from it starts fresh."""
        for h in self.hooks:
            if h.name in state:
                h.load_state_dict(state[h.name])


def _same(back: Any, state: Any) -> bool:
    """Whether ``back`` (JSON's reading of ``state``) is ``state``, of the same
    types all the way down (NaN equal to NaN)."""
    if type(back) is not type(state):
        return False
    if isinstance(state, dict):
        return back.keys() == state.keys() and all(_same(back[k], state[k]) for k in state)
    if isinstance(state, list):
        return len(back) == len(state) and all(map(_same, back, state))
    if isinstance(state, float) and state != state:
        return back != back
    return bool(back == state)


__all__ = [
    "HookError",
    "RoundEnd",
    "RoundGate",
    "RoundHook",
    "RoundHooks",
    "RoundInfo",
    "RoundKind",
]
