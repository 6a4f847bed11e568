"""The alert rules on a run store whose rows the test writes: each rule fires at
exactly the rounds computed by hand below, once while its condition holds and
again after it cleared; a healthy run fires nothing; a monitor started mid-run
(a resume) rebuilds the rules' state from the store and fires as the
uninterrupted one; the alerts table holds what fired, read by plain sqlite3;
bad rule values are refused with one line naming the field."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fedforge.alerts import Monitor, RoundFacts, Watch, evaluate, stored_facts
from fedforge.config import Config, from_dict
from fedforge.config.alerts import redact_alerts, redacted_command, redacted_url
from fedforge.core.errors import ConfigError
from fedforge.store import AnomalyRecord, ClientRecord, RoundRecord, RunStore

RULES = [
    {"kind": "accuracy_drop", "threshold": 5},
    {"kind": "refused_rate", "threshold": 0.5},
    {"kind": "client_refused", "threshold": 2},
    {"kind": "dp_budget"},  # 0.9 of privacy.target_epsilon = 10
    {"kind": "no_progress", "threshold": 3},
]

# round index: (test accuracy or None, clients used, clients refused)
TROUBLED: list[tuple[float | None, set[int], set[int]]] = [
    (0.50, {0, 1, 2, 3}, set()),
    (0.60, {0, 1, 2}, {3}),
    (None, {0, 1, 2}, {3}),  # client 3 refused twice running: client_refused
    (0.70, {0, 1}, {2, 3}),  # 2 of 4 refused: refused_rate
    (0.64, {0, 1, 2, 3}, set()),  # 6 points below 0.70: accuracy_drop; 3 used again
    (0.66, {0, 1, 2}, {3}),  # 4 points below: cleared
    (0.60, {1, 2}, {0, 3}),  # 10 below: again; 2 of 4; client 3 twice again; 3 rounds since r3
    (None, set(), {0, 1, 2, 3}),  # all refused: refused_rate still holds; client 0 twice
    (0.72, {0, 1, 2, 3}, set()),  # a new best: no_progress clears; epsilon 9 of 10
    (0.72, {0, 1, 2, 3}, set()),  # a tie is no improvement
]
# (round index, rule, client): worked out from the table above
EXPECTED = [
    (2, "client_refused", 3),
    (3, "refused_rate", None),
    (4, "accuracy_drop", None),
    (6, "accuracy_drop", None),
    (6, "refused_rate", None),
    (6, "client_refused", 3),
    (6, "no_progress", None),
    (7, "client_refused", 0),
    (8, "dp_budget", None),
]
HEALTHY: list[tuple[float | None, set[int], set[int]]] = [
    (0.5 + 0.04 * r if r % 2 else None, {0, 1, 2, 3}, set()) for r in range(8)
]


def _config(tmp_path: Path, rules: list[dict[str, Any]] | None = None) -> Config:
    return from_dict(
        {
            "num_clients": 4,
            "client_fraction": 1.0,
            "runs_dir": str(tmp_path),
            "privacy": {"dp": "central", "target_epsilon": 10.0},
            "alerts": {"rules": RULES if rules is None else rules},
        }
    )


def _write_run(tmp_path: Path, rounds: list[tuple[float | None, set[int], set[int]]]) -> RunStore:
    """A run store holding ``rounds`` (epsilon r + 1 after round index r)."""
    store = RunStore.create(tmp_path, _config(tmp_path))
    for r, (acc, used, refused) in enumerate(rounds):
        record = RoundRecord(r, 4, 0.5, acc, None if acc is None else 1.0, 10, 10, 0, 0.1, 0.2)
        clients = [ClientRecord(r, c, 5, 0.5, 1.0, 5, 5) for c in sorted(used)]
        anomalies = [AnomalyRecord(r, c, f"non-finite update {r}") for c in sorted(refused)]
        if not used:
            anomalies.append(AnomalyRecord(r, None, "no valid update"))
        store.record_round(record, clients, anomalies)
        store.record_privacy(r, float(r + 1), 1e-5, 1.0)
    return store


def _fired(firings: list[Any]) -> list[tuple[int, str, int | None]]:
    return [(f.round_idx, f.rule, f.client_id) for f in firings]


def test_each_rule_fires_at_the_hand_computed_rounds(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with _write_run(tmp_path, TROUBLED) as store:
        facts = stored_facts(store, 0)
        firings = evaluate(cfg.alerts.rules, facts, target_epsilon=10.0)
    assert sorted(_fired(firings)) == sorted(EXPECTED)
    by = {(f.round_idx, f.rule): f for f in firings}
    drop = by[(4, "accuracy_drop")]
    assert drop.value == pytest.approx(6.0) and drop.threshold == 5.0
    assert drop.message == (
        "test accuracy 64.00% is 6.00 points below the best so far, 70.00% (round 4)"
    )
    assert by[(6, "accuracy_drop")].value == pytest.approx(10.0)
    assert by[(3, "refused_rate")].message == "2 of 4 clients asked were refused (50.00%)"
    assert by[(6, "no_progress")].value == 3.0  # the best set in round index 3
    assert by[(8, "dp_budget")].value == pytest.approx(0.9)
    assert by[(8, "dp_budget")].threshold == 0.9
    assert "epsilon 9 spent: 90.00% of privacy.target_epsilon 10" in by[(8, "dp_budget")].message
    refused = [f for f in firings if f.kind == "client_refused"]
    assert [f.value for f in refused] == [2.0, 2.0, 2.0]
    assert refused[2].message == "client 0's upload refused 2 rounds running: non-finite update 7"


def test_a_healthy_run_fires_nothing(tmp_path: Path) -> None:
    with _write_run(tmp_path, HEALTHY[:8]) as store:  # epsilon reaches 8 of 10
        facts = stored_facts(store, 0)
    assert [f.round_idx for f in facts] == list(range(8))
    assert evaluate(_config(tmp_path).alerts.rules, facts, target_epsilon=10.0) == []


def test_fire_once_clear_and_fire_again() -> None:
    """A condition that holds for rounds 1-3 fires in round 1 only; measured false
    in round 4, it fires again in round 5; an unmeasured round (no uploads)
    neither fires nor clears."""
    cfg = from_dict({"alerts": {"rules": [{"kind": "refused_rate", "threshold": 0.5}]}})
    rates = [0, 1, 1, 1, 0, 1, None, 1, 0, 1]  # refused of 2 uploads; None: no upload
    history = []
    for r, refused in enumerate(rates):
        if refused is None:
            history.append(RoundFacts(r, None))
            continue
        used = frozenset({0, 1} - set(range(refused)))
        history.append(RoundFacts(r, None, used, {c: "bad" for c in range(refused)}, asked=2))
    assert [f.round_idx for f in evaluate(cfg.alerts.rules, history)] == [1, 5, 9]
    watch = Watch(cfg.alerts.rules)
    assert [len(watch.step(f)) for f in history[:3]] == [0, 1, 0]
    assert watch.active == {("refused_rate", None)}


# round index: (clients used, clients refused); cohort 4 every round; "skip": no
# update used (no client row; a skip row), "local": a round of an upload period
SKIPPING: list[tuple[str, set[int], set[int]]] = [
    ("used", {0, 1, 2}, {3}),  # 1 of 4 refused; client 3's streak 1
    ("skip", set(), {3}),  # 1 of 4 asked (not 1 of 1); client 3 twice running: fires
    ("used", {0, 1}, {2, 3}),  # 2 of 4: refused_rate fires; client 2's streak 1, 3's 3
    ("skip", set(), {2}),  # 1 of 4: cleared; client 2 twice: fires; client 3 not measured
    ("used", {0, 1, 2}, {3}),  # client 3 still holds (streak 4, no reset in round 3)
    ("local", set(), set()),  # nobody asked: not measured
    ("skip", set(), {0, 1, 2, 3}),  # 4 of 4: fires again (cleared in round 3)
]


def _write_skipping(tmp_path: Path) -> RunStore:
    store = RunStore.create(tmp_path, _config(tmp_path))
    for r, (kind, used, refused) in enumerate(SKIPPING):
        record = RoundRecord(r, 4, 0.5, None, None, 10, 10, 0, 0.1, 0.2)
        clients = [ClientRecord(r, c, 5, 0.5, 1.0, 5, 5) for c in sorted(used)]
        anomalies = [AnomalyRecord(r, c, f"refused {r}") for c in sorted(refused)]
        if kind == "skip":
            anomalies.append(AnomalyRecord(r, None, "too few updates accepted"))
        store.record_round(record, clients, anomalies)
    return store


def test_a_skipped_round_is_measured_over_the_clients_asked(tmp_path: Path) -> None:
    """A skipped round stores no client row: its refusals count against the 4
    clients asked, not against the refused alone; the clients it did not refuse
    keep their streaks (neither reset nor grown); a local round is not measured."""
    rules = [{"kind": "refused_rate", "threshold": 0.5}, {"kind": "client_refused", "threshold": 2}]
    with _write_skipping(tmp_path) as store:
        facts = stored_facts(store, 0)
    assert [f.asked for f in facts] == [4, 4, 4, 4, 4, 0, 4]
    watch = Watch(_config(tmp_path, rules).alerts.rules)
    firings = [f for fact in facts for f in watch.step(fact)]
    assert _fired(firings) == [
        (1, "client_refused", 3),
        (2, "refused_rate", None),
        (3, "client_refused", 2),
        (6, "refused_rate", None),
    ]
    rates = [(f.value, f.message) for f in firings if f.kind == "refused_rate"]
    assert rates == [
        (0.5, "2 of 4 clients asked were refused (50.00%)"),
        (1.0, "4 of 4 clients asked were refused (100.00%)"),
    ]
    assert watch.streaks == {0: 1, 1: 1, 2: 1, 3: 5}


def test_a_monitor_started_mid_run_rebuilds_from_the_store(tmp_path: Path) -> None:
    """A resumed run's monitor steps through the stored rounds silently, then fires
    exactly the uninterrupted run's alerts of the rounds it watches; the table's
    rows, read by sqlite3, are those alerts (a rule without action: 'logged')."""
    cfg = _config(tmp_path)
    with _write_run(tmp_path, TROUBLED) as store:
        late = Monitor(cfg, say=lambda _: None)
        recorded = [a for r in range(5, len(TROUBLED)) for a in late.after_round(store, r)]
        path = store.path
    want = [e for e in EXPECTED if e[0] >= 5]
    assert [(a.round_idx, a.rule, a.client_id) for a in recorded] == want
    with sqlite3.connect(path / "store.sqlite") as conn:
        rows = conn.execute(
            "SELECT round_idx, rule, kind, client_id, outcome FROM alerts ORDER BY rowid"
        ).fetchall()
    assert rows == [(r, rule, rule, c, "logged") for r, rule, c in want]
    with RunStore.open(path, read_only=True) as store:
        assert store.alerts() == recorded


def test_a_rewind_drops_the_alerts_of_the_rounds_run_again(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with _write_run(tmp_path, TROUBLED) as store:
        monitor = Monitor(cfg, say=lambda _: None)
        for r in range(len(TROUBLED)):
            monitor.after_round(store, r)
        assert len(store.alerts()) == len(EXPECTED)
        store.rewind(6)
        assert [(a.round_idx, a.rule) for a in store.alerts()] == [
            (r, rule) for r, rule, _ in EXPECTED if r < 6
        ]


@pytest.mark.parametrize(
    "rule, words",
    [
        ({"threshold": 5}, ["'alerts.rules[0].kind' = None", "accuracy_drop, refused_rate"]),
        ({"kind": "accuracy_drop"}, ["'alerts.rules[0].threshold' = None", "(0, 100]"]),
        ({"kind": "accuracy_drop", "threshold": 150}, ["150.0", "percentage points"]),
        ({"kind": "refused_rate", "threshold": 0}, ["threshold' = 0.0", "(0, 1]"]),
        ({"kind": "client_refused", "threshold": 2.5}, ["2.5", "whole number of rounds"]),
        ({"kind": "no_progress", "threshold": 0}, ["threshold' = 0.0", ">= 1"]),
        ({"kind": "no_progress", "threshold": 3, "url": "file:///etc/passwd"}, ["http://"]),
        ({"kind": "no_progress", "threshold": 3, "url": "https://"}, ["with a host"]),
        ({"kind": "no_progress", "threshold": 3, "command": "notify-send done"}, ["shell"]),
        ({"kind": "no_progress", "threshold": 3, "command": [""]}, ["command' = ['']"]),
        ({"kind": "no_progress", "threshold": 3, "timeout": 0}, ["timeout' = 0.0", "seconds"]),
        ({"kind": "no_progress", "threshold": 3, "name": ""}, ["name' = ''", "printable"]),
        ({"kind": "nope"}, ["'alerts.rules.kind' = 'nope'", "'no_progress'"]),
        ({"kind": "no_progress", "thresold": 3}, ["did you mean 'alerts.rules.threshold'"]),
    ],
)
def test_bad_rule_values_are_refused_naming_the_field(
    rule: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        from_dict({"alerts": {"rules": [rule]}})
    text = str(caught.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_a_budget_rule_needs_a_budget_and_names_are_unique() -> None:
    with pytest.raises(ConfigError, match=r"'alerts.rules\[0\].kind' = 'dp_budget'.*target_eps"):
        from_dict({"alerts": {"rules": [{"kind": "dp_budget"}]}})
    two = [{"kind": "refused_rate", "threshold": 0.5}, {"kind": "refused_rate", "threshold": 0.2}]
    with pytest.raises(ConfigError, match=r"'alerts.rules\[1\].name'.*'refused_rate'"):
        from_dict({"alerts": {"rules": two}})
    two[1]["name"] = "some refused"
    assert [r.label for r in from_dict({"alerts": {"rules": two}}).alerts.rules] == [
        "refused_rate",
        "some refused",
    ]


def test_a_rules_url_and_command_are_redacted_for_showing() -> None:
    """What the report and the exports show of a rule: where it goes and which
    program runs, none of the path, query, user, folders or arguments."""
    assert redacted_url("https://me:pw@hooks.example.com/T/abc?token=x") == (
        "https://hooks.example.com/…"
    )
    assert redacted_url("http://[::1]:8080/secret") == "http://[::1]:8080/…"
    assert redacted_url("no url at all") == "…"
    assert redacted_command(["/opt/s3cret/bin/notify-send", "--token", "s3cret"]) == [
        "notify-send",
        "…",
    ]
    rules = [{"kind": "no_progress", "url": "https://h.example/x", "command": ["a", "b"]}, "x"]
    data = {"name": "r", "alerts": {"rules": rules}}
    assert redact_alerts(data) == {
        "name": "r",
        "alerts": {
            "rules": [
                {"kind": "no_progress", "url": "https://h.example/…", "command": ["a", "…"]},
                "…",  # not a rule this version reads: all of it
            ]
        },
    }
    assert rules[0]["url"] == "https://h.example/x"  # the data given is left as it was
    assert redact_alerts({"alerts": "https://h.example/x"}) == {"alerts": "…"}
    assert redact_alerts({"alerts": {"rules": []}}) == {"alerts": {"rules": []}}
