"""The alert rules on a running run: after each round is recorded, the round's
facts are read back from the run store, the rules stepped, each firing's
actions run and the alert recorded in the store's ``alerts`` table.

The rules' state is rebuilt from the store whenever the round to watch is not
the one after the last watched (a resumed run, a new monitor): the rounds
stored before it are stepped through without acting, so a resumed run fires
where the uninterrupted one would. The rounds a resume runs again were rewound
from the store, their alerts too: those alerts fire, and act, again.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

from fedforge.alerts.actions import act
from fedforge.alerts.rules import Firing, RoundFacts, Watch
from fedforge.config import Config
from fedforge.store.records import AlertRecord
from fedforge.store.runstore import RunStore

NO_ACTION = "logged"  # the outcome of a rule without a command or URL


def stored_facts(store: RunStore, first: int, stop: int | None = None) -> list[RoundFacts]:
    """The facts of the recorded rounds ``first`` <= round < ``stop`` (None: all
    from ``first``): test accuracy, the clients used and refused, the clients
    asked (the cohort of a round that collected updates: one with a client row
    or an anomaly row, a skip included; 0 for a local round of an upload
    period), epsilon spent (an infinite epsilon is stored as NULL: read back as
    inf)."""
    rounds = [r for r in store.rounds(first) if stop is None or r.round_idx < stop]
    if not rounds:
        return []
    one = rounds[0].round_idx if len(rounds) == 1 else None  # the usual case: one round
    accepted: dict[int, set[int]] = {}
    for c in store.client_rounds(one):
        accepted.setdefault(c.round_idx, set()).add(c.client_id)
    refused: dict[int, dict[int, str]] = {}
    collected = set(accepted)
    for a in store.anomalies(round_idx=one):
        collected.add(a.round_idx)
        if a.client_id is not None:
            refused.setdefault(a.round_idx, {})[a.client_id] = a.reason
    spent = {r: math.inf if e is None else e for r, e, _, _ in store.privacy() if r >= first}
    return [
        RoundFacts(
            r.round_idx,
            r.test_accuracy,
            frozenset(accepted.get(r.round_idx, ())),
            refused.get(r.round_idx, {}),
            spent.get(r.round_idx),
            asked=r.cohort_size if r.round_idx in collected else 0,
        )
        for r in rounds
    ]


def to_record(firing: Firing, outcome: str) -> AlertRecord:
    """The store's row of a firing (a value past a float, an infinite epsilon's
    share of the budget, as None: SQLite stores it as NULL)."""
    fields = dataclasses.asdict(firing)
    value = fields.pop("value")
    return AlertRecord(**fields, value=value if math.isfinite(value) else None, outcome=outcome)


class Monitor:
    """The run's alert rules, watching its store round by round. ``say``: where
    the one-line notices go (the loop's progress bar)."""

    def __init__(self, cfg: Config, say: Callable[[str], None] = print) -> None:
        self.rules = {rule.label: rule for rule in cfg.alerts.rules}
        self.target_epsilon = cfg.privacy.target_epsilon
        self.say = say
        self.watch = Watch(tuple(self.rules.values()), self.target_epsilon)

    def after_round(self, store: RunStore, round_idx: int) -> list[AlertRecord]:
        """Step the rules through recorded round ``round_idx``; act on and record
        what fires. Returns the round's alerts as recorded."""
        if not self.rules:
            return []
        if self.watch.next_round != round_idx:
            self.watch = Watch(tuple(self.rules.values()), self.target_epsilon)
            for facts in stored_facts(store, 0, stop=round_idx):
                self.watch.step(facts)  # their alerts are in the store already
        alerts = []
        for facts in stored_facts(store, round_idx, stop=round_idx + 1):
            for firing in self.watch.step(facts):
                alerts.append(self._act(firing, store.path))
        if alerts:
            rows = [dataclasses.astuple(a) for a in alerts]
            store.record_rows("alerts", round_idx, rows)
        return alerts

    def _act(self, firing: Firing, run_dir: Path) -> AlertRecord:
        self.say(
            f"fedforge: alert {firing.rule!r} after round {firing.round_idx + 1}: {firing.message}"
        )
        rule = self.rules[firing.rule]
        outcomes = act(rule, to_record(firing, ""), run_dir)
        for failed in (o for o in outcomes if " failed: " in o):
            self.say(f"fedforge: alert {firing.rule!r}: {failed}; the run goes on")
        return to_record(firing, "; ".join(outcomes) or NO_ACTION)
