"""Canary rollout of a new global model: who is in the canary, and when the new
version is promoted or rolled back. Pure logic, no I/O: the server asks
:func:`in_canary` which version a client gets, feeds the canary clients'
evaluation reports to a :class:`CanaryJudge`, and acts on its
:meth:`~CanaryJudge.decide` through ``store/versions.py`` (``promote``,
``rollback``, ``update_metrics`` with :meth:`Decision.metrics`).

The candidate is judged against the serving version on the same clients and
the same examples: each canary client evaluates both on its own data, and a
client counts once both of its reports are in. The verdict is the median, over
those clients, of each client's change (candidate minus serving, on its own
data): the candidate is rolled back when that median is worse than the serving
version by more than ``max_drop`` (in the metric's own units); a drop equal to
``max_drop`` (to 1e-9, the rounding of the scores) promotes it. A median is a
rule no one client can swing: a liar among three or more honest reports moves
it at most to a neighbouring honest value, and an honest majority decides.
Example counts do not weigh (a client's count is its own say, and one count of
10^12 would otherwise decide). The versions' shown scores are the medians of
their per-client scores. A score that is not a finite number is refused, as a
report of no such metric is: it does not count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import statistics
from collections.abc import Mapping
from typing import Literal

from fedforge.core.errors import ConfigError, shown

DecisionKind = Literal["wait", "promote", "rollback"]
_TOLERANCE = 1e-9  # of a drop against max_drop, relative to the scores' size (at least 1)


def _invalid(name: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"canary field '{name}' = {shown(value)} is invalid: {allowed}")


def _check_fraction(fraction: object) -> float:
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or not 0.0 < fraction <= 1.0
    ):
        raise _invalid("fraction", fraction, "a number in (0, 1]")
    return float(fraction)


@dataclasses.dataclass(frozen=True)
class CanaryPolicy:
    """How a new version is rolled out: to ``fraction`` of the clients first, then
    judged on ``metric`` once ``min_reports`` canary clients have reported; it
    may be worse than the serving version by at most ``max_drop``."""

    fraction: float
    metric: str = "accuracy"
    max_drop: float = 0.01
    min_reports: int = 3
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        _check_fraction(self.fraction)
        if not isinstance(self.metric, str) or not self.metric:
            raise _invalid("metric", self.metric, "the name of a reported metric")
        drop = self.max_drop
        if (
            isinstance(drop, bool)
            or not isinstance(drop, int | float)
            or not 0.0 <= drop < math.inf
        ):
            raise _invalid("max_drop", drop, "a finite number >= 0")
        reports = self.min_reports
        if isinstance(reports, bool) or not isinstance(reports, int) or reports < 1:
            raise _invalid("min_reports", reports, "an integer >= 1")
        if not isinstance(self.higher_is_better, bool):
            raise _invalid("higher_is_better", self.higher_is_better, "true or false")


def canary_draw(client_id: int, version_id: int, seed: int) -> float:
    """The client's draw for the rollout of ``version_id``: uniform in [0, 1),
    from sha256 of (seed, version, client), the same on every machine and run."""
    text = f"canary/{int(seed)}/{int(version_id)}/{int(client_id)}"
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def in_canary(client_id: int, version_id: int, fraction: float, seed: int) -> bool:
    """Whether the client is served ``version_id`` while it is the canary. The same
    client, version and seed always give the same answer; each version draws its
    own canary; a larger fraction keeps every client a smaller one had (ramping
    a rollout up never moves a client back to the serving version)."""
    return canary_draw(client_id, version_id, seed) < _check_fraction(fraction)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the judge says: 'wait' for more reports, 'promote' or 'rollback',
    with a one-line reason holding the numbers."""

    kind: DecisionKind
    reason: str
    metric: str
    candidate: float | None  # medians of the per-client scores of the clients counted
    serving: float | None
    clients: int
    change: float | None = None  # the median of the clients' candidate - serving

    def metrics(self) -> dict[str, float]:
        """The canary's numbers, for the candidate's stored metrics."""
        out = {"canary_clients": float(self.clients)}
        if self.candidate is not None and self.serving is not None:
            out[f"canary_{self.metric}"] = self.candidate
            out[f"canary_serving_{self.metric}"] = self.serving
        return out


def _apart(drop: float, max_drop: float, ok: bool) -> tuple[str, str]:
    """``drop`` and ``max_drop`` to 3 significant digits, or more when a drop past
    the limit would otherwise print as equal to it."""
    for digits in range(3, 13):
        texts = f"{drop:.{digits}g}", f"{max_drop:.{digits}g}"
        if ok or texts[0] != texts[1]:
            break
    return texts


@dataclasses.dataclass(frozen=True)
class _Report:
    value: float
    num_examples: int


class CanaryJudge:
    """Collects the canary clients' reports on the candidate and on the serving
    version, and decides. :meth:`report` returns None, or why it refused one
    (as the collectors do): a refused report is not counted."""

    def __init__(self, policy: CanaryPolicy, candidate_id: int, serving_id: int) -> None:
        if candidate_id == serving_id:
            raise ValueError(f"the candidate and the serving version are both {candidate_id}")
        self.policy = policy
        self.candidate_id, self.serving_id = candidate_id, serving_id
        self._reports: dict[int, dict[int, _Report]] = {candidate_id: {}, serving_id: {}}

    def report(
        self, client_id: int, version_id: int, metrics: Mapping[str, float], num_examples: int
    ) -> str | None:
        """Client ``client_id``'s evaluation of ``version_id`` on ``num_examples`` of
        its examples; None when taken, else the reason it was refused."""
        name = self.policy.metric
        reports = self._reports.get(version_id)
        if reports is None:
            return (
                f"version {version_id} is neither the candidate ({self.candidate_id}) "
                f"nor the serving version ({self.serving_id})"
            )
        if client_id in reports:
            return f"client {client_id} already reported on version {version_id}"
        if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
            return f"client {client_id} reported {shown(num_examples)} examples; at least 1"
        value = metrics.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"client {client_id}'s report on version {version_id} has no number '{name}'"
        if not math.isfinite(value):
            return f"client {client_id}'s '{name}' on version {version_id} is {value}: not finite"
        other_id = self.serving_id if version_id == self.candidate_id else self.candidate_id
        other = self._reports[other_id].get(client_id)
        if other is not None and other.num_examples != num_examples:
            return (
                f"client {client_id} evaluated version {version_id} on {num_examples} examples "
                f"but version {other_id} on {other.num_examples}: not the same data"
            )
        reports[client_id] = _Report(float(value), num_examples)
        return None

    def paired_clients(self) -> list[int]:
        """The clients that reported on both versions, ascending."""
        return sorted(set(self._reports[self.candidate_id]) & set(self._reports[self.serving_id]))

    def _median(self, version_id: int, clients: list[int]) -> float:
        return statistics.median(self._reports[version_id][c].value for c in clients)

    def decide(self) -> Decision:
        """'wait' until ``min_reports`` clients reported on both versions; then
        'rollback' if the median of the clients' changes is worse by more than
        ``max_drop``, else 'promote'."""
        policy, name = self.policy, self.policy.metric
        clients = self.paired_clients()
        n = len(clients)
        if n < policy.min_reports:
            return Decision(
                "wait",
                f"{name}: {n} of {policy.min_reports} canary clients reported on both the "
                f"candidate and the serving version",
                name,
                None,
                None,
                n,
            )
        cand_of, serv_of = self._reports[self.candidate_id], self._reports[self.serving_id]
        change = statistics.median(cand_of[c].value - serv_of[c].value for c in clients)
        cand, serv = (
            self._median(self.candidate_id, clients),
            self._median(self.serving_id, clients),
        )
        drop = -change if policy.higher_is_better else change
        tolerance = _TOLERANCE * max(1.0, abs(cand), abs(serv))
        ok = drop <= policy.max_drop + tolerance
        head = f"{name} {cand:.3f} vs {serv:.3f} serving (medians of {n} canary clients)"
        worse = "dropped" if policy.higher_is_better else "rose"
        if drop < 0:
            why = f"better by {-drop:.3g}"
        elif drop == 0:
            why = "the same"
        else:
            shown_drop, allowed = _apart(drop, policy.max_drop, ok)
            why = f"{worse} {shown_drop} {'<=' if ok else '>'} {allowed} allowed"
        kind: DecisionKind = "promote" if ok else "rollback"
        return Decision(
            kind, f"{head}: {why} (the clients' median change)", name, cand, serv, n, change
        )
