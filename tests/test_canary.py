"""Tests of the canary rollout's decision logic: the policy's checks, the
deterministic canary assignment, and the judge's decisions on hand-computed
medians of the clients' changes, which one lying client cannot swing."""

from __future__ import annotations

import math

import pytest

from fedforge.core.errors import ConfigError
from fedforge.transport.canary import CanaryJudge, CanaryPolicy, canary_draw, in_canary

CANDIDATE, SERVING = 2, 1


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("fraction", 0.0, r"a number in \(0, 1\]"),
        ("fraction", 1.5, r"a number in \(0, 1\]"),
        ("fraction", True, r"a number in \(0, 1\]"),
        ("max_drop", -0.01, "a finite number >= 0"),
        ("max_drop", math.inf, "a finite number >= 0"),
        ("min_reports", 0, "an integer >= 1"),
        ("min_reports", 2.0, "an integer >= 1"),
        ("metric", "", "the name of a reported metric"),
    ],
)
def test_policy_refuses_bad_fields(field: str, value: object, allowed: str) -> None:
    kwargs: dict[str, object] = {"fraction": 0.1, field: value}
    with pytest.raises(ConfigError, match=f"canary field '{field}' = .* is invalid: {allowed}"):
        CanaryPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_defaults() -> None:
    policy = CanaryPolicy(fraction=1)
    assert (policy.metric, policy.max_drop, policy.min_reports, policy.higher_is_better) == (
        "accuracy",
        0.01,
        3,
        True,
    )


def test_canary_assignment_is_deterministic_and_near_the_fraction() -> None:
    clients = range(10_000)
    picked = [c for c in clients if in_canary(c, 7, 0.1, seed=42)]
    assert picked == [c for c in clients if in_canary(c, 7, 0.1, seed=42)]
    assert abs(len(picked) / 10_000 - 0.1) < 0.02
    for fraction in (0.01, 0.25, 0.5):
        share = sum(in_canary(c, 3, fraction, seed=0) for c in clients) / 10_000
        assert abs(share - fraction) < 0.02
    # another version or seed draws another canary of about the same size
    other = {c for c in clients if in_canary(c, 8, 0.1, seed=42)}
    assert other != set(picked) and abs(len(other) / 10_000 - 0.1) < 0.02
    assert {c for c in clients if in_canary(c, 7, 0.1, seed=43)} != set(picked)
    # ramping up keeps every client already in; the whole federation at 1
    wider = {c for c in clients if in_canary(c, 7, 0.3, seed=42)}
    assert set(picked) <= wider
    assert all(in_canary(c, 7, 1.0, seed=42) for c in clients)
    draws = [canary_draw(c, 7, 42) for c in range(100)]
    assert all(0.0 <= d < 1.0 for d in draws) and len(set(draws)) == 100
    with pytest.raises(ConfigError, match="canary field 'fraction' = 0 is invalid"):
        in_canary(1, 7, 0, seed=42)


def _judge(**policy: object) -> CanaryJudge:
    settings: dict[str, object] = {"fraction": 0.1, **policy}
    return CanaryJudge(CanaryPolicy(**settings), CANDIDATE, SERVING)  # type: ignore[arg-type]


def _both(
    judge: CanaryJudge, client: int, cand: float, serv: float, n: int, name: str = "accuracy"
) -> None:
    assert judge.report(client, CANDIDATE, {name: cand}, n) is None
    assert judge.report(client, SERVING, {name: serv}, n) is None


def test_wait_until_min_reports_clients_reported_on_both() -> None:
    judge = _judge()
    _both(judge, 1, 0.90, 0.92, 100)
    _both(judge, 2, 0.95, 0.95, 300)
    judge.report(3, CANDIDATE, {"accuracy": 0.5}, 100)  # its serving report is missing
    decision = judge.decide()
    assert (decision.kind, decision.clients, decision.candidate) == ("wait", 2, None)
    assert decision.reason == (
        "accuracy: 2 of 3 canary clients reported on both the candidate and the serving version"
    )
    assert decision.metrics() == {"canary_clients": 2.0}


def test_rollback_on_a_median_drop_past_the_limit() -> None:
    # changes (candidate - serving): -0.02, 0.00, -0.05: median -0.02, a drop of
    # 0.02 > 0.01; the shown scores are the medians 0.90 (of 0.90, 0.95, 0.80) and
    # 0.92 (of 0.92, 0.95, 0.85)
    judge = _judge()
    _both(judge, 1, 0.90, 0.92, 100)
    _both(judge, 2, 0.95, 0.95, 300)
    _both(judge, 3, 0.80, 0.85, 100)
    decision = judge.decide()
    assert decision.kind == "rollback"
    assert decision.candidate == pytest.approx(0.90) and decision.serving == pytest.approx(0.92)
    assert decision.change == pytest.approx(-0.02)
    assert decision.reason == (
        "accuracy 0.900 vs 0.920 serving (medians of 3 canary clients): dropped 0.02 > "
        "0.01 allowed (the clients' median change)"
    )
    assert decision.metrics() == pytest.approx(
        {"canary_clients": 3.0, "canary_accuracy": 0.90, "canary_serving_accuracy": 0.92}
    )
    # example counts do not weigh: the same scores on other counts decide the same
    loose = _judge(max_drop=0.025)
    for client, cand, serv, n in ((1, 0.90, 0.92, 1), (2, 0.95, 0.95, 1), (3, 0.8, 0.85, 10**12)):
        _both(loose, client, cand, serv, n)
    assert loose.decide().kind == "promote" and loose.decide().change == decision.change


def test_one_liar_among_five_cannot_flip_the_decision() -> None:
    """Four honest clients see the candidate better by 0.01 to 0.03; a fifth claims
    10^12 examples and 0.0 for the candidate against 1.0 serving. An
    example-weighted mean would say dropped ~1.0 (rollback); the median of the
    changes (+0.01, +0.02, +0.02, +0.03, -1.0) is +0.02: promoted. The same liar
    cannot save a worse candidate either, nor can two liars beat three honest."""
    honest = ((1, 0.91, 0.90), (2, 0.92, 0.90), (3, 0.93, 0.91), (4, 0.94, 0.91))
    judge = _judge(min_reports=5)
    for client, cand, serv in honest:
        _both(judge, client, cand, serv, 100)
    _both(judge, 5, 0.0, 1.0, 10**12)
    decision = judge.decide()
    assert decision.kind == "promote" and decision.change == pytest.approx(0.02)
    worse = _judge(min_reports=5)
    for client, _, serv in honest:  # each honest client now sees a drop of 0.05
        _both(worse, client, serv - 0.05, serv, 100)
    _both(worse, 5, 1.0, 0.0, 10**12)
    assert worse.decide().kind == "rollback" and worse.decide().change == pytest.approx(-0.05)
    # the honest majority decides: three see a drop of 0.05, two liars claim +1
    majority = _judge(min_reports=5)
    for client in (1, 2, 3):
        _both(majority, client, 0.85, 0.90, 100)
    for client in (4, 5):
        _both(majority, client, 1.0, 0.0, 10**12)
    assert majority.decide().kind == "rollback"
    # and when the majority lies, the majority decides (the rule's limit)
    captured = _judge(min_reports=5)
    for client in (1, 2):
        _both(captured, client, 0.95, 0.90, 100)
    for client in (3, 4, 5):
        _both(captured, client, 0.0, 1.0, 100)
    assert captured.decide().kind == "rollback"


def test_a_drop_equal_to_the_limit_promotes() -> None:
    # 0.93 - 0.92 is 0.010000000000000009 in floats: still the limit, promoted
    judge = _judge(max_drop=0.01)
    for client, n in ((1, 10), (2, 20), (3, 30)):
        _both(judge, client, 0.92, 0.93, n)
    decision = judge.decide()
    assert decision.kind == "promote"
    assert decision.reason == (
        "accuracy 0.920 vs 0.930 serving (medians of 3 canary clients): dropped 0.01 <= "
        "0.01 allowed (the clients' median change)"
    )
    past = _judge(max_drop=0.01)
    for client, n in ((1, 10), (2, 20), (3, 30)):
        _both(past, client, 0.9199, 0.93, n)
    assert past.decide().kind == "rollback"
    assert "dropped 0.0101 > 0.01 allowed" in past.decide().reason
    closer = _judge(max_drop=0.01)
    for client in (1, 2, 3):
        _both(closer, client, 0.5, 0.5100001, 1)
    assert "dropped 0.0100001 > 0.01 allowed" in closer.decide().reason


def test_better_equal_and_lower_is_better() -> None:
    better = _judge(min_reports=1)
    _both(better, 4, 0.95, 0.90, 50)
    assert better.decide().kind == "promote"
    assert "(medians of 1 canary clients): better by 0.05" in better.decide().reason
    same = _judge(min_reports=1, max_drop=0)
    _both(same, 4, 0.9, 0.9, 50)
    assert ": the same" in same.decide().reason and same.decide().kind == "promote"
    # loss: changes 0.00 and +0.08, their median (of two: the mean) +0.04: rose 0.04;
    # shown: the medians (0.30 + 0.40) / 2 = 0.35 and (0.30 + 0.32) / 2 = 0.31
    loss = _judge(metric="loss", higher_is_better=False, min_reports=2)
    _both(loss, 1, 0.30, 0.30, 1, "loss")
    _both(loss, 2, 0.40, 0.32, 3, "loss")
    decision = loss.decide()
    assert decision.kind == "rollback"
    assert decision.reason == (
        "loss 0.350 vs 0.310 serving (medians of 2 canary clients): rose 0.04 > 0.01 "
        "allowed (the clients' median change)"
    )
    lower = _judge(metric="loss", higher_is_better=False, min_reports=1)
    _both(lower, 1, 0.20, 0.30, 5, "loss")
    assert lower.decide().kind == "promote"


def test_a_score_that_is_not_finite_is_refused_and_does_not_count() -> None:
    """One client's NaN or infinity would decide alone (a NaN compares false): it
    is refused like a report without the metric, and the others decide."""
    judge = _judge(min_reports=2)
    _both(judge, 1, 0.9, 0.9, 10)
    assert judge.report(2, CANDIDATE, {"accuracy": math.nan}, 10) == (
        "client 2's 'accuracy' on version 2 is nan: not finite"
    )
    assert judge.report(3, SERVING, {"accuracy": -math.inf}, 10) == (
        "client 3's 'accuracy' on version 1 is -inf: not finite"
    )
    assert judge.decide().kind == "wait"
    _both(judge, 4, 0.91, 0.9, 10)
    assert judge.decide().kind == "promote" and judge.paired_clients() == [1, 4]


def test_reports_that_are_refused_do_not_count() -> None:
    judge = _judge(min_reports=1)
    assert judge.report(1, 9, {"accuracy": 0.9}, 10) == (
        "version 9 is neither the candidate (2) nor the serving version (1)"
    )
    assert judge.report(1, CANDIDATE, {"loss": 0.9}, 10) == (
        "client 1's report on version 2 has no number 'accuracy'"
    )
    assert (
        judge.report(1, CANDIDATE, {"accuracy": 0.9}, 0)
        == "client 1 reported 0 examples; at least 1"
    )
    assert judge.report(1, CANDIDATE, {"accuracy": 0.9}, 10) is None
    assert (
        judge.report(1, CANDIDATE, {"accuracy": 0.1}, 10)
        == "client 1 already reported on version 2"
    )
    assert judge.report(1, SERVING, {"accuracy": 0.9}, 11) == (
        "client 1 evaluated version 1 on 11 examples but version 2 on 10: not the same data"
    )
    assert judge.decide().kind == "wait" and judge.paired_clients() == []
    assert judge.report(1, SERVING, {"accuracy": 0.9}, 10) is None
    assert judge.paired_clients() == [1] and judge.decide().kind == "promote"
    with pytest.raises(ValueError, match="both 3"):
        CanaryJudge(CanaryPolicy(fraction=0.5), 3, 3)
