"""The default bound on an update's size, relative to what the federation's
clients send (``robust.max_norm_multiple``).

An update whose L2 norm passes ``multiple`` times the typical norm is refused.
The typical norm is the median norm of the updates the model took in the last
``robust.norm_window`` rounds that took any (the run's loop state keeps them,
checkpointed). Refused updates are not counted: a client that is refused and
asked again (a selection policy that favours clients it knows nothing of, or
the ones that answer fastest) would otherwise fill the window with its own
norms and raise the bound until it is taken. The price: when every client's
norm jumps past ``multiple`` at once (a learning rate too high for full-batch
steps), every later update is refused and ``robust.max_refused_fraction`` stops
the run, naming this bound, rather than the model taking updates no one can
tell from an attack's. A round with none behind it (the run's first) judges its
uploads by the median of their own norms: they wait for the round's end before
any reaches the aggregate. The median of an even count is the lower middle
value, so one honest update beside one attacker's sets the bound. A median is
what one client, or any minority, cannot move far: an attacker's huge update
is refused however few honest updates stand beside it, and the honest ones are
far inside the bound (their norms differ by a small factor, not by
``multiple``).

Where the server gives clients their own learning rates (``local.lr_rule``) and
``local.lr_rule_scales_bounds`` is set, a client told to step s > 1 times the
plan's lr may move up to s times as far: its bound is s times the others' (its
"room"), so a small client the rule speeds up x4 is not refused for the rule's
choice. The norms are remembered as they came:
dividing them by s would assume a delta linear in the lr, which a client
whose local steps converge does not follow (its norm grows less than s-fold,
and the median would fall under the plan-lr clients' norms). A client slowed
down (s < 1) keeps the plain bound: the rule never gives an update more room
than a client at the plan's lr has.

A median of zero (every update empty) sets no bound. Under secure aggregation
the server never sees an update's norm and this bound does not apply (the
clients' own clipping and the checks of the masked inputs stand instead).
Runs on the server; pure arithmetic, no state of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace


def typical_norm(recent: Sequence[Sequence[float]], upper: bool = False) -> float | None:
    """The median of the norms in ``recent`` (rounds of norms): of an even count
    the lower middle value, or the upper one with ``upper``; None when there are
    none or the median is not a positive number."""
    flat = sorted(float(x) for r in recent for x in r)
    if not flat:
        return None
    med = flat[len(flat) // 2] if upper else flat[(len(flat) - 1) // 2]
    return med if med > 0 and math.isfinite(med) else None


def remember(
    recent: Sequence[Sequence[float]], taken: Sequence[float], window: int
) -> list[list[float]]:
    """``recent`` with a round that took updates of norms ``taken`` appended,
    the last ``window`` rounds kept (a round that took none leaves it as it was)."""
    rounds = [[float(x) for x in r] for r in recent]
    if taken:
        rounds.append([float(x) for x in taken])
    return rounds[-window:]


@dataclass(frozen=True)
class RelativeBound:
    """``multiple`` x the typical norm of ``rounds`` recent rounds; ``typical``
    None: the round has none behind it and waits for its own median (``own``:
    the typical norm is that median, once the round's uploads are in)."""

    multiple: float
    typical: float | None
    rounds: int
    own: bool = False

    @classmethod
    def of(cls, multiple: float, recent: Sequence[Sequence[float]]) -> RelativeBound:
        return cls(multiple, typical_norm(recent), len(recent))

    @property
    def waits(self) -> bool:
        """Whether the round's uploads wait for the median of their own norms."""
        return self.typical is None and not self.own

    def settled(self, norms: Sequence[float]) -> RelativeBound:
        """For a round that waits: the bound set by the median of its own
        uploads' norms (no bound when that median is not a positive number)."""
        return replace(self, typical=typical_norm([norms]), own=True)

    def refusal(self, norm: float, room: float = 1.0) -> str | None:
        """Why an update of norm ``norm`` is refused against ``room`` x the
        multiple of the recent rounds' median (or the round's own, once
        settled); None when it is within that bound (or the round waits)."""
        if self.typical is None:
            return None
        if self.own:
            what = "this round's uploads (no earlier round took any)"
        else:
            rounds = f"{self.rounds} round{'s' if self.rounds != 1 else ''}"
            what = f"the updates taken in the last {rounds}"
        return _past(norm, room, self.multiple, self.typical, what)

    def cohort_refusals(
        self, norms: Sequence[float], rooms: Sequence[float] | None = None
    ) -> list[str | None]:
        """For a round that waits: each upload's refusal against the median of
        the round's own norms (``rooms``: each upload's room; None: all 1)
        (None: taken)."""
        settled = self.settled(norms)
        rooms = [1.0] * len(norms) if rooms is None else rooms
        return [settled.refusal(n, r) for n, r in zip(norms, rooms, strict=True)]


def _past(norm: float, room: float, multiple: float, typical: float, what: str) -> str | None:
    bound = room * multiple * typical
    if norm <= bound:
        return None
    median = f"the median norm of {what}"
    of = f", {median}" if room == 1.0 else f" ({median}) x {room:g} (the client's lr scale)"
    return (
        f"update norm {norm:.4g} passes the bound {bound:.4g} = robust.max_norm_multiple "
        f"({multiple:g}) x {typical:.4g}{of}"
    )
