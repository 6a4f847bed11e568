"""The alert rules, evaluated round by round: facts in, firings out, no I/O.

A :class:`Watch` holds what the rules remember (the best test accuracy and its
round, each client's run of refused uploads, which conditions hold) and steps
one round at a time; :func:`evaluate` folds a whole history. Each rule's
condition is tested on the rounds where it can be measured (``accuracy_drop``
on evaluated rounds, ``refused_rate`` on rounds whose cohort was asked for
updates, ``client_refused`` for the clients refused or used that round (in a
skipped round the others are not measured), ``dp_budget`` where epsilon is
recorded, ``no_progress`` once there is a best); a rule fires once when its
condition becomes true, stays quiet while it holds, and may fire again after a
round where it was measured false. The state is a function of the stored
rounds alone, so a resumed run rebuilds it by stepping through them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fedforge.config.alerts import AlertRule


@dataclass(frozen=True)
class RoundFacts:
    """What the rules read of one recorded round."""

    round_idx: int
    test_accuracy: float | None  # None: not evaluated this round
    accepted: frozenset[int] = frozenset()  # clients whose updates the round used
    refused: Mapping[int, str] = field(default_factory=dict)  # client: why (the last)
    epsilon: float | None = None  # spent after the round; None: not accounted (no DP)
    # the clients asked for an update (the round's cohort); 0: none asked (a round
    # inside an upload period, whose cohort trains on without uploading)
    asked: int = 0


@dataclass(frozen=True)
class Firing:
    """A rule that fired after round ``round_idx``: the value it measured against
    its threshold, in the threshold's units, and the client it names (or None)."""

    round_idx: int
    rule: str
    kind: str
    client_id: int | None
    value: float
    threshold: float
    message: str


# a rule's reading of one round: per subject (None: the run; a client id), the
# measured value and the message when the condition holds, None when it does not;
# subjects the round cannot measure are left out (their state stays)
Reading = dict[int | None, tuple[float, str] | None]


def at_least(value: float, limit: float) -> bool:
    """``value >= limit``, a float's last bit aside (0.7 - 0.65 is 5 points)."""
    return value >= limit or math.isclose(value, limit, rel_tol=1e-9, abs_tol=1e-12)


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.2f}%"


class Watch:
    """The rules' state after the rounds stepped through so far."""

    def __init__(self, rules: Sequence[AlertRule], target_epsilon: float | None = None) -> None:
        self.rules = tuple(rules)
        self.target_epsilon = target_epsilon
        self.next_round = 0  # the round the next step is expected to be
        self.best: float | None = None  # the best test accuracy so far ...
        self.best_round = -1  # ... first reached in this round
        self.streaks: dict[int, int] = {}  # client: uploads refused in a row
        self.active: set[tuple[str, int | None]] = set()  # (rule, subject) holding

    def step(self, facts: RoundFacts) -> list[Firing]:
        """Take in one round; the firings it causes, in rule order."""
        self._track(facts)
        fired: list[Firing] = []
        for rule in self.rules:
            for subject, held in READERS[str(rule.kind)](self, rule, facts).items():
                key = (rule.label, subject)
                if held is None:
                    self.active.discard(key)  # cleared: it may fire again
                elif key not in self.active:
                    self.active.add(key)
                    value, message = held
                    fired.append(
                        Firing(
                            facts.round_idx,
                            rule.label,
                            str(rule.kind),
                            subject,
                            value,
                            rule.limit,
                            message,
                        )
                    )
        self.next_round = facts.round_idx + 1
        return fired

    def _track(self, facts: RoundFacts) -> None:
        acc = facts.test_accuracy
        if acc is not None and (self.best is None or acc > self.best):
            self.best, self.best_round = acc, facts.round_idx
        # a used update ends a client's streak, a refused one adds to it; in a
        # skipped round (asked, none used: too few accepted, a secure sum not
        # revealed) a client not refused may have sent a good update the round
        # did not use: not measured, its streak stays as it was
        for client in facts.accepted:
            if client not in facts.refused:
                self.streaks[client] = 0
        for client in facts.refused:
            self.streaks[client] = self.streaks.get(client, 0) + 1


def _accuracy_drop(watch: Watch, rule: AlertRule, facts: RoundFacts) -> Reading:
    acc, best = facts.test_accuracy, watch.best
    if acc is None or best is None:
        return {}
    points = 100 * (best - acc)
    held = at_least(points, rule.limit)
    message = (
        f"test accuracy {_pct(acc)} is {points:.2f} points below the best so far, "
        f"{_pct(best)} (round {watch.best_round + 1})"
    )
    return {None: (points, message) if held else None}


def _refused_rate(watch: Watch, rule: AlertRule, facts: RoundFacts) -> Reading:
    """The refused share of the clients asked: refused / cohort. Not the share of
    the updates seen: a skipped round keeps no row of the updates it received
    but did not use, and a client that sent nothing was asked all the same."""
    if facts.asked == 0:  # nobody was asked (a local round of an upload period)
        return {}
    refused = len(facts.refused)
    asked = max(facts.asked, len(facts.accepted | facts.refused.keys()))  # a stray upload
    rate = refused / asked
    message = f"{refused} of {asked} clients asked were refused ({_pct(rate)})"
    return {None: (rate, message) if at_least(rate, rule.limit) else None}


def _client_refused(watch: Watch, rule: AlertRule, facts: RoundFacts) -> Reading:
    """Each client refused or used this round, against its streak of refusals;
    in a skipped round the clients not refused are left out (not measured)."""
    reading: Reading = {}
    for client in sorted(facts.accepted | facts.refused.keys()):
        streak = watch.streaks.get(client, 0)
        if at_least(streak, rule.limit):
            why = facts.refused.get(client, "")
            message = f"client {client}'s upload refused {streak} rounds running: {why}"
            reading[client] = (float(streak), message)
        else:
            reading[client] = None
    return reading


def _dp_budget(watch: Watch, rule: AlertRule, facts: RoundFacts) -> Reading:
    eps, budget = facts.epsilon, watch.target_epsilon
    if eps is None or budget is None:
        return {}
    spent = eps / budget
    message = f"epsilon {eps:.4g} spent: {_pct(spent)} of privacy.target_epsilon {budget:g}"
    return {None: (spent, message) if at_least(spent, rule.limit) else None}


def _no_progress(watch: Watch, rule: AlertRule, facts: RoundFacts) -> Reading:
    if watch.best is None:  # nothing evaluated yet: no best to improve on
        return {}
    since = facts.round_idx - watch.best_round
    message = (
        f"the best test accuracy, {_pct(watch.best)} (round {watch.best_round + 1}), "
        f"not improved for {since} rounds"
    )
    return {None: (float(since), message) if at_least(since, rule.limit) else None}


READERS: dict[str, Callable[[Watch, AlertRule, RoundFacts], Reading]] = {
    "accuracy_drop": _accuracy_drop,
    "refused_rate": _refused_rate,
    "client_refused": _client_refused,
    "dp_budget": _dp_budget,
    "no_progress": _no_progress,
}


def evaluate(
    rules: Sequence[AlertRule],
    history: Iterable[RoundFacts],
    target_epsilon: float | None = None,
) -> list[Firing]:
    """Every firing of ``rules`` over ``history`` (rounds in order), in order."""
    watch = Watch(rules, target_epsilon)
    return [firing for facts in history for firing in watch.step(facts)]
