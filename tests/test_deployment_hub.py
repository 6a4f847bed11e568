"""The deployment hub's rules, without the network: what it takes, from whom,
how many, and what a client can and cannot make it hold."""

from __future__ import annotations

import hashlib
import json
import math
import threading
from pathlib import Path

import pytest
import torch

from fedforge.config import Config
from fedforge.transport.hub import Hub
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.rollout import Rollout, read_canary_report
from fedforge.transport.work import EVALUATION, UPDATE


def _hub(**kw: object) -> Hub:
    # an update's answer waits for no round thread here (test_an_update_is_answered_...)
    kw.setdefault("verdict_wait_s", 0.0)
    return Hub(num_clients=6, heartbeat_timeout_s=5.0, **kw)  # type: ignore[arg-type]


def _header(
    session: str, cid: int, r: int = 0, version: int = 0, kind: str = UPDATE, phase: str = ""
) -> pb.UploadHeader:
    return pb.UploadHeader(
        session=session,
        client_id=cid,
        round_idx=r,
        model_version=version,
        kind=kind,
        phase=phase,
        size=1,
        sha256=hashlib.sha256(b"x").digest(),
    )


def _said(hub: Hub, header: pb.UploadHeader, data: bytes) -> str | None:
    """What the hub says of an answer at once: why it refused it, else None (taken:
    an update's verdict is the round thread's, still to come)."""
    verdict = hub.submit("a", header, data)
    return verdict.future.result(0) if verdict.settled else None


def _train(cid: int, r: int = 0) -> pb.Work:
    return pb.Work(kind=pb.Work.TRAIN, client_id=cid, round_idx=r, payload_id=f"round-{r}")


def test_an_update_is_answered_with_the_rounds_verdict() -> None:
    """Each uploader hears what the round thread's collector said of its update;
    one that arrived past the needed count hears that its round had closed."""
    hub = _hub(verdict_wait_s=30.0)
    session, _, _ = hub.join("a", [(c, 10) for c in range(3)])
    hub.ask([_train(c) for c in range(3)], 0)
    hub.poll("a", session, 0, False)
    said: dict[int, str | None] = {}

    def upload(c: int) -> None:
        said[c] = hub.answer("a", _header(session, c), b"u")

    threads = [threading.Thread(target=upload, args=(c,)) for c in range(3)]
    for t in threads:
        t.start()
    while len(hub.book.inbox) < 3:
        threading.Event().wait(0.01)
    verdicts = {}
    for n, a in enumerate(hub.gather({(c, 0, UPDATE, "") for c in range(3)}, 5.0, need=2)):
        assert a.verdict is not None
        verdicts[a.client_id] = None if n == 0 else "delta holds non-finite values"
        a.verdict.settle(verdicts[a.client_id])
    for t in threads:
        t.join(10)
    (late,) = set(range(3)) - set(verdicts)
    assert said == {**verdicts, late: f"client {late}'s update came after its round closed"}


def test_gather_stops_at_the_needed_count_and_takes_nothing_past_it() -> None:
    hub = _hub()
    session, ok, _ = hub.join("a", [(c, 10) for c in range(6)])
    hub.serve("round-0", b"model")
    hub.ask([_train(c) for c in range(6)], 0)
    assert len(hub.poll("a", session, 0, False)) == 6
    for c in range(4):  # four arrive before the round thread looks
        assert _said(hub, _header(session, c), b"u%d" % c) is None
    taken = list(hub.gather({(c, 0, UPDATE, "") for c in range(6)}, 1.0, need=2))
    assert [a.client_id for a in taken] == [0, 1]
    assert hub.bytes_up == 4 and hub.accepted == 2  # the other two were never taken
    late = hub.answer("a", _header(session, 5), b"u5")
    assert late is not None and "was not asked" in late


def test_an_answer_is_taken_once_for_the_version_given() -> None:
    hub = _hub()
    session, _, _ = hub.join("a", [(0, 10)])
    hub.ask([_train(0, r=3)], version=3)
    assert "not asked" in hub.expects("a", _header(session, 0, r=3, version=3))  # not handed
    hub.poll("a", session, 0, False)
    assert "version 9" in hub.answer("a", _header(session, 0, r=3, version=9), b"x")
    assert _said(hub, _header(session, 0, r=3, version=3), b"x") is None


def test_commit_notices_come_again_until_acknowledged_and_only_as_notices() -> None:
    hub = _hub()
    session, _, _ = hub.join("a", [(0, 10)])
    hub.ask([pb.Work(kind=pb.Work.COMMIT, client_id=0, round_idx=1, model_version=1)], 1)
    assert [w.kind for w in hub.poll("a", session, 0, False)] == [pb.Work.COMMIT]
    for kind in (EVALUATION, UPDATE):  # a notice is not an answer of another kind
        assert hub.answer("a", _header(session, 0, r=1, version=1, kind=kind), b"x") is not None
    again, _, _ = hub.join("a", [(0, 10)])  # restarted before acknowledging: it comes again
    assert [w.kind for w in hub.poll("a", again, 0, False)] == [pb.Work.COMMIT]
    assert hub.answer("a", _header(again, 0, r=1, version=1, kind="notice"), b"") is None
    assert hub.book.inbox == [] and hub.accepted == 0  # nobody waits for it
    later, _, _ = hub.join("a", [(0, 10)])
    assert hub.poll("a", later, 0, False) == []


def test_ids_are_held_by_their_names_and_a_join_is_bounded() -> None:
    hub = _hub(allowed={"a": frozenset({0, 1}), "b": frozenset({2})})
    _, ok, refused = hub.join("a", [(0, 1), (2, 1), (9, 1)])
    assert ok == [0]
    reasons = dict(refused)
    assert "not among the ids 'a' may host" in reasons[2] and "outside" in reasons[9]
    with pytest.raises(ValueError, match="a join of 7 client ids"):
        hub.join("a", [(0, 1)] * 7)
    first = _hub()
    first.join("a", [(0, 1)])
    assert "hosted by 'a'" in dict(first.join("b", [(0, 1)])[2])[0]


def test_a_session_downloads_only_the_models_its_work_named() -> None:
    hub = _hub()
    sa, _, _ = hub.join("a", [(0, 1)])
    sb, _, _ = hub.join("b", [(1, 1)])
    hub.serve("round-0", b"model")
    hub.ask([_train(0)], 0)
    hub.poll("a", sa, 0, False)
    assert hub.payload("a", sa, "round-0") == b"model"
    with pytest.raises(KeyError, match="not served to this session"):
        hub.payload("b", sb, "round-0")


@pytest.mark.parametrize(
    "report,why",
    [
        ({"accuracy": 0.5, "loss": 1.25, "num_examples": 10}, None),
        ({"accuracy": 0.5, "loss": 1.25, "num_examples": 11}, "num_examples = 11: must be an"),
        ({"accuracy": 0.5, "loss": 1.25, "num_examples": 10**400}, "num_examples = 1000000000"),
        ({"accuracy": float("nan"), "loss": 1.0, "num_examples": 3}, "accuracy = nan: must be"),
        ({"accuracy": 0.5, "loss": float("inf"), "num_examples": 3}, "loss = inf: must be a"),
        ({"accuracy": True, "loss": 1.0, "num_examples": 3}, "accuracy = True: must be"),
        ({"accuracy": 0.5, "loss": 1.0, "num_examples": -1}, "num_examples = -1: must be"),
        ({"accuracy": 0.5, "num_examples": 3}, "loss = None: must be a finite number >= 0"),
        # scores no model can have, and a negative loss
        ({"accuracy": -1e9, "loss": 1.0, "num_examples": 3}, "accuracy = -1000000000.0: must "),
        ({"accuracy": 1.5, "loss": 1.0, "num_examples": 3}, "accuracy = 1.5: must be in [0, 1]"),
        ({"accuracy": 0.5, "loss": -0.1, "num_examples": 3}, "loss = -0.1: must be a finite"),
        ({"accuracy": 10**400, "loss": 1.0, "num_examples": 3}, "accuracy = 1000000000"),
    ],
)
def test_evaluation_reports_are_bounded(report: dict, why: str | None) -> None:
    got = read_canary_report(json.dumps(report).encode(), declared=10)
    if why is None:
        assert got == {"accuracy": 0.5, "loss": 1.25, "num_examples": 10.0}
    else:
        assert isinstance(got, str) and got.startswith(why), got
    assert read_canary_report(b"\xff{", 10) == "not a JSON report"
    assert read_canary_report(b"[1]", 10) == "not a JSON object"


def test_a_regression_score_may_be_negative_but_not_past_one() -> None:
    """R^2 lies in (-inf, 1]: a bad model's -3.5 is a real score, 1.5 is not."""
    r2 = (-math.inf, 1.0)
    report = {"accuracy": -3.5, "loss": 2.0, "num_examples": 4}
    assert read_canary_report(json.dumps(report).encode(), 4, r2) == {**report, "num_examples": 4.0}
    report["accuracy"] = 1.5
    assert (
        read_canary_report(json.dumps(report).encode(), 4, r2)
        == "accuracy = 1.5: must be in [-inf, 1]"
    )


def test_evaluations_are_bounded_by_the_evaluation_count_declared_at_join() -> None:
    """Client 0 trains on 2 examples and evaluates on 8 (its test.npz); client 1
    said no evaluation count (0: its 3 training examples). A report of 8 rows is
    taken from 0; one of 4 from 1 is not; a negative count is refused at join."""
    hub = _hub()
    session, ok, refused = hub.join("a", [(0, 2), (1, 3), (2, 5)], {0: 8, 2: -1})
    assert ok == [0, 1] and "num_eval_examples = -1" in dict(refused)[2]
    assert [hub.members[c].num_eval_examples for c in ok] == [8, 3]
    assert hub.declared()[:2] == [2, 3]  # the training counts weigh the updates

    def client() -> None:
        works: list[pb.Work] = []
        while len(works) < 2:
            works += hub.poll("a", session, 1.0, False)
        for w in works:
            n = 8 if w.client_id == 0 else 4
            header = _header(session, w.client_id, w.round_idx, w.model_version, EVALUATION)
            header.phase = w.phase
            report = {"accuracy": 0.5, "loss": 1.0, "num_examples": n}
            assert hub.answer("a", header, json.dumps(report).encode()) is None

    answering = threading.Thread(target=client)
    answering.start()
    got = Rollout(hub, Config()).evaluate([0, 1], b"model", "cold-start-0", "cold_start", 0)
    answering.join()
    assert got == {0: {"accuracy": 0.5, "loss": 1.0, "num_examples": 8.0}}


def test_a_client_process_trains_on_one_thread(tmp_path: object) -> None:
    """Client processes share a host's cores: each trains on one torch thread,
    whatever torch's default (the thread plan is applied, not only made)."""
    from fedforge.config.parse import from_dict
    from fedforge.transport.hosted import build_hosted

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cfg = from_dict({"dataset": "synthetic", "model": "logreg", "num_clients": 4})
        build_hosted(cfg, [0, 1], None, "")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_client_process_builds_without_the_servers_client_tags(tmp_path: Path) -> None:
    """``evaluation.client_tags`` names a CSV on the server's host: the server's build reads
    it; a client process, on a host without the file, builds from the config the
    server sends (Hello) all the same."""
    from fedforge.config.parse import dump, from_dict
    from fedforge.server.experiment import build
    from fedforge.transport.hosted import build_hosted, client_config

    tags = tmp_path / "tags.csv"
    tags.write_text("client_id,region\n0,north\n1,south\n2,north\n")
    base = {"dataset": "synthetic", "model": "logreg", "num_clients": 4}
    base["evaluation"] = {"clients": True}
    cfg = from_dict({**base, "evaluation": {"clients": True, "client_tags": str(tags)}})
    served = build(cfg).data.client_tags()["region"]
    assert served == ("north", "south", "north", "untagged")
    sent = dump(cfg)
    tags.unlink()  # the client's host has no such file
    local = client_config(sent, "cpu")
    assert (
        local.evaluation.client_tags is None
        and local.evaluation.clients
        and cfg.evaluation.client_tags == str(tags)
    )
    exp = build_hosted(local, [0, 1], None, "")
    assert "region" not in exp.data.client_tags()
    plain = build(from_dict(base)).data  # the same rows as without tags
    for c in (0, 1):
        assert torch.equal(exp.data.client_data(c)[0], plain.client_data(c)[0])


@pytest.mark.parametrize(
    ("changes", "held"),
    [
        ({"algorithm": "scaffold"}, "SCAFFOLD"),
        ({"algorithm": "fedbn", "model": "cnn_bn"}, "FedBN"),
        (
            {
                "communication.uplink": "topk",
                "communication.fraction": 0.1,
                "communication.error_feedback": True,
            },
            "error feedback",
        ),
    ],
)
def test_client_held_state_needs_a_checkpoint_every_round(
    changes: dict[str, object], held: str
) -> None:
    from fedforge.config import Config, override
    from fedforge.core.errors import ConfigError
    from fedforge.transport.serve import _served

    cfg = override(Config(checkpoint_every=10), changes)
    with pytest.raises(ConfigError, match=f"checkpoint_every: 10 with {held}.*needs 1"):
        _served(cfg)
    assert _served(override(cfg, {"checkpoint_every": 1})).engine == "serial"
    assert _served(Config(checkpoint_every=10)).checkpoint_every == 10  # fedavg holds none


def test_a_resume_with_client_held_state_needs_a_checkpoint_every_round(
    tmp_path: object,
) -> None:
    """The same refusal when a stored run (here a simulation's) is resumed as a
    deployment: before anything listens."""
    from pathlib import Path

    from fedforge import run
    from fedforge.config import Config, override
    from fedforge.core.errors import ConfigError
    from fedforge.transport.security import ServerSecurity
    from fedforge.transport.serve import ServerOptions, serve_resume

    changes = {
        "algorithm": "scaffold",
        "dataset": "synthetic",
        "model": "logreg",
        "rounds": 1,
        "num_clients": 4,
        "checkpoint_every": 10,
        "runs_dir": str(tmp_path),
    }
    done = run(override(Config(), changes))
    assert done.run_dir is not None
    with pytest.raises(ConfigError, match="checkpoint_every: 10 with SCAFFOLD"):
        serve_resume(Path(done.run_dir), ServerOptions(ServerSecurity("insecure"), port=0))


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (
            {"privacy.dp": "local", "deployment.cold_start": True},
            "deployment.cold_start with privacy.dp = 'local':",
        ),
        (
            {"privacy.dp": "local", "deployment.canary_every": 2},
            "deployment.canary_every with privacy.dp = 'local':",
        ),
        (
            {
                "privacy.secagg": True,
                "privacy.tiers.high_fraction": 0.5,
                "deployment.cold_start": True,
            },
            "deployment.cold_start with privacy.secagg and privacy tiers:",
        ),
        (
            {"privacy.secagg": True, "communication.clip_norm": 1.0, "deployment.cold_start": True},
            "deployment.cold_start with privacy.secagg:",
        ),
    ],
)
def test_evaluation_reports_are_refused_where_the_server_is_not_trusted(
    changes: dict[str, object], named: str
) -> None:
    from fedforge.config import Config, override
    from fedforge.core.errors import ConfigError
    from fedforge.transport.serve import _served

    cfg = override(Config(checkpoint_every=1), changes)
    with pytest.raises(ConfigError, match=named):
        _served(cfg)
    quiet = {"deployment.cold_start": False, "deployment.canary_every": 0}
    assert _served(override(cfg, quiet)).engine == "serial"


def test_client_held_state_needs_an_upload_every_round() -> None:
    from fedforge.config import Config, override
    from fedforge.core.errors import ConfigError
    from fedforge.transport.serve import _served

    cfg = override(Config(checkpoint_every=1), {"algorithm": "scaffold"})
    with pytest.raises(ConfigError, match="communication.upload_every: 2 with SCAFFOLD"):
        _served(override(cfg, {"communication.upload_every": 2}))


def test_a_serving_index_of_another_run_is_not_taken(tmp_path: object) -> None:
    """Version ids start again in every run: a state folder reused by another run
    (another config) does not serve the old run's model; processes sharing a
    folder keep their own index."""
    from pathlib import Path

    import torch

    from fedforge.core.errors import DataError
    from fedforge.core.params import ParamSpec
    from fedforge.transport.serving import ServingModels, load_serving

    folder = Path(str(tmp_path))
    spec = ParamSpec.of(torch.nn.Linear(2, 1))
    a = ServingModels(folder, [0, 1], "run: a")
    a.keep(1, 0, torch.arange(3.0), spec, [0, 1])
    b = ServingModels(folder, [2], "run: a")
    b.keep(2, 5, torch.ones(3), spec, [2])
    assert load_serving(folder, 0)[0] == 1 and load_serving(folder, 2)[0] == 2
    assert torch.equal(load_serving(folder, 1)[1]["bias"], torch.tensor([2.0]))
    assert ServingModels(folder, [0, 1], "run: a").needs(0, 1) is False  # a restart keeps it
    other = ServingModels(folder, [0, 1], "run: b")  # another run's config
    assert other.needs(0, 1) and not list(folder.glob("serving-0-1-v*.safetensors"))
    with pytest.raises(DataError, match="client 0 serves no model version"):
        load_serving(folder, 0)
    with pytest.raises(DataError, match="client 7 serves no model version"):
        load_serving(folder, 7)


@pytest.mark.parametrize("operator", ["rollback", "promote"])
def test_an_operators_decision_during_a_canary_stands(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, operator: str
) -> None:
    """`fedforge models rollback|promote` while the canary's clients evaluate: the
    judge's own decision (here: rollback, the candidate scoring worse) is not
    applied over it (it would undo the promotion, or fail on the rolled-back
    version), and the run does not fail."""
    from pathlib import Path

    import torch

    from fedforge.config import Config, override
    from fedforge.store import RunStore
    from fedforge.store import versions as vs
    from fedforge.transport.rollout import Rollout

    cfg = override(
        Config(),
        {
            "deployment.canary_every": 1,
            "deployment.canary_fraction": 1.0,
            "deployment.canary_min_reports": 2,
        },
    )
    hub = Hub(4, 30.0)
    hub.join("a", [(0, 10), (1, 10)])
    rollout = Rollout(hub, cfg)
    store = RunStore.create(Path(str(tmp_path)), cfg)
    rollout.bind(store)
    first = vs.add_version(store, torch.zeros(3), 0, None, {}, status="promoted")

    def evaluate(
        ids: list[int], payload: bytes, pid: str, label: str, round_idx: int
    ) -> dict[int, dict[str, float]]:
        cand = vs.canary(store)
        if cand is not None:  # the operator, while the clients evaluate
            getattr(vs, operator)(store, cand.version_id)
        worse = label.endswith(f"-v{first.version_id + 1}")  # the candidate's scores
        report = {"accuracy": 0.2 if worse else 0.9, "loss": 1.0, "num_examples": 10}
        return {c: dict(report) for c in ids}

    monkeypatch.setattr(rollout, "evaluate", evaluate)
    rollout._canary(1, torch.ones(3))
    versions = {v.version_id: v.status for v in vs.list_versions(store)}
    want = "rolled_back" if operator == "rollback" else "promoted"
    assert versions[first.version_id + 1] == want
    assert versions[first.version_id] == ("promoted" if operator == "rollback" else "superseded")
    store.close()
