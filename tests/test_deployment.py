"""A federation of real processes on loopback: a ``fedforge server`` and client
processes over gRPC end where the simulator ends, and count the bytes they send."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
import torch

from deploy_procs import run_dir_of, start_client, start_server, write_config
from deploy_sim import ALL, _participants, _skips
from deploy_sim import _simulated as _simulated_without
from fedforge import config as config_mod
from fedforge import run
from fedforge.core.params import ParamSpec
from fedforge.server.experiment import build
from fedforge.store.final import load_final
from fedforge.transport.serving import load_serving


def _simulated(cfg_path: Path, tmp: Path) -> torch.Tensor:
    cfg = config_mod.override(config_mod.load(cfg_path), {"runs_dir": str(tmp / "sim")})
    return run(cfg).params


def _store_bytes(run_dir: Path) -> tuple[int, int]:
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        up, down = db.execute("SELECT SUM(bytes_up), SUM(bytes_down) FROM rounds").fetchone()
    return int(up), int(down)


def test_deployment_ends_where_the_simulator_ends(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml")
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
    assert server.wait(180) == 0, server.log.read_text()
    for c in clients:
        assert c.wait(60) == 0, c.log.read_text()
    run_dir = tmp_path / run_dir_of(server)
    deployed = load_final(run_dir)["params"]
    simulated = _simulated(cfg, tmp_path)
    assert deployed.dtype == torch.float64
    assert (deployed - simulated).abs().max().item() <= 1e-9
    # the bytes the store counts are the payload bytes that crossed the wire
    end = next(e for e in server.events() if e.get("event") == "finished")
    assert _store_bytes(run_dir) == (end["wire_bytes_up"], end["wire_bytes_down"])
    assert end["wire_bytes_up"] > 0
    joined = [e for c in clients for e in c.events() if e.get("event") == "joined"]
    assert sorted(c for e in joined for c in e["clients"]) == list(range(6))


def test_server_refuses_a_bad_config_in_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", deployment={"over_selection": -1})
    with pytest.raises(AssertionError, match="deployment.over_selection"):
        start_server(tmp_path, cfg, "--insecure")


def test_server_needs_certs_or_insecure(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml")
    with pytest.raises(AssertionError, match="needs --certs DIR"):
        start_server(tmp_path, cfg)


def private(folder: str, name: str) -> bool:
    """Whether a file of a federation's folder is kept off the server's machine."""
    return name == "ca.key" or (Path(folder).name == "clients" and name.endswith(".key"))


def own_folder(fed: Path, name: str) -> Path:
    """What client ``name``'s machine is given of the federation ``fed``."""
    own = fed.parent / f"certs-{name}"
    (own / "clients").mkdir(parents=True)
    shutil.copy(fed / "ca.pem", own)
    for suffix in (".pem", ".key"):
        shutil.copy(fed / "clients" / f"{name}{suffix}", own / "clients")
    return own


def test_mutual_tls_federation_refuses_the_uncertified_and_the_revoked(tmp_path: Path) -> None:
    """The default: TLS with client certificates from `fedforge certs`. A process
    without a certificate of the federation's CA never gets in, nor does a revoked
    one; the certified ones finish the run."""
    from fedforge.cli import main

    fed = tmp_path / "fed"
    assert main(["certs", "--out", str(fed), "--clients", "0-2", "--ids-per-client", "3"]) == 0
    (fed / "revoked.txt").write_text("client-2\n")
    other = tmp_path / "other"  # another CA's client
    assert main(["certs", "--out", str(other), "--clients", "0"]) == 0
    cfg = write_config(tmp_path / "cfg.yaml", deployment={"start_clients": 6})
    # as the README hands them out: the server's folder without ca.key and the
    # clients' keys, each certified client a folder of its own with ca.pem and
    # its own pair only
    served = tmp_path / "served"
    shutil.copytree(fed, served, ignore=lambda d, names: [n for n in names if private(d, n)])
    server, port = start_server(tmp_path, cfg, "--certs", str(served))
    clients = [
        start_client(tmp_path, port, ids, "--certs", str(own_folder(fed, name)), "--name", name)
        for ids, name in (("0-2", "client-0"), ("3-5", "client-1"))
    ]
    intruders = [
        start_client(
            tmp_path, port, "0-5", "--certs", str(fed), "--name", "client-2", "--give-up-s", "3"
        ),
        start_client(
            tmp_path, port, "0-5", "--certs", str(other), "--name", "client-0", "--give-up-s", "3"
        ),
    ]
    assert server.wait(180) == 0, server.log.read_text()
    for c in clients:
        assert c.wait(60) == 0, c.log.read_text()
    for c in intruders:
        assert c.wait(60) in (1, 2), c.log.read_text()
        assert "Traceback" not in c.log.read_text()
    # the revoked certificate fails the TLS handshake: no call of client-2 is served
    refused = [e for e in server.events() if e.get("event") == "refused"]
    assert not any("client-2" in str(e.get("sender")) for e in refused)
    assert not any(e.get("name") == "client-2" for e in intruders[0].events())
    assert "UNAVAILABLE" in intruders[0].log.read_text()
    run_dir = tmp_path / run_dir_of(server)
    assert (load_final(run_dir)["params"] - _simulated(cfg, tmp_path)).abs().max().item() <= 1e-9


@pytest.mark.parametrize(
    "fields",
    [
        {"algorithm": "scaffold"},
        pytest.param(
            {"communication": {"uplink": "topk", "fraction": 0.1, "error_feedback": True}},
            marks=pytest.mark.slow,
        ),
    ],
    ids=["scaffold", "topk-error-feedback"],
)
def test_client_state_lives_on_the_client_and_survives_its_restart(
    tmp_path: Path, fields: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCAFFOLD's c_k and error-feedback residuals stay in the client processes (c_k
    kept when the server says the update was used); a client process that dies
    when handed round 3's training and is started again with its --state-dir
    carries on once round 3 is recorded. Its three clients missing, round 3 is
    short of min_clients = 6 and skipped; round 4 waits for them
    (deployment.live_wait_s): the run ends where the simulator without them in
    round 3 ends."""
    cfg = write_config(
        tmp_path / "cfg.yaml",
        rounds=4,
        client_fraction=1.0,
        robust={"min_clients": 6},
        deployment={"live_wait_s": 120},
        **fields,
    )
    server, port = start_server(tmp_path, cfg, "--insecure")
    state = ["--state-dir", str(tmp_path / "state-a")]
    monkeypatch.setenv("FEDFORGE_TEST_EXIT_AT", "2:train")
    a = start_client(tmp_path, port, "0-2", "--insecure", *state)
    monkeypatch.delenv("FEDFORGE_TEST_EXIT_AT")
    b = start_client(tmp_path, port, "3-5", "--insecure")
    assert a.wait(120) == 1, a.log.read_text()  # handed round 3's work: it died
    _wait_for_round(tmp_path, 3)  # round 3 closed without it (it has not rejoined)
    a = start_client(tmp_path, port, "0-2", "--insecure", *state)
    assert server.wait(180) == 0, server.log.read_text()
    for c in (a, b):
        assert c.wait(60) == 0, c.log.read_text()
    loaded = [e for e in a.events() if e.get("event") == "state_loaded"]
    assert loaded and loaded[0]["rows"] > 0
    run_dir = tmp_path / run_dir_of(server)
    assert _skips(run_dir) == {2: "only 3 accepted update(s), fewer than min_clients = 6"}
    assert _participants(run_dir) == {0: ALL, 1: ALL, 2: set(), 3: ALL}
    gone = _simulated_without(
        cfg, tmp_path, monkeypatch, lambda r, p: {0, 1, 2} if r == 2 else set()
    )
    assert (load_final(run_dir)["params"] - gone.params).abs().max().item() <= 1e-9


def _wait_for_round(tmp: Path, n: int, timeout: float = 120) -> None:
    """Until the server's run store holds ``n`` rounds."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for db in (tmp / "runs").glob("[!.]*/store.sqlite"):
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                    if conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0] >= n:
                        return
            except sqlite3.OperationalError:  # being created
                pass
        time.sleep(0.05)
    raise AssertionError(f"the server did not record {n} rounds")


def test_new_clients_are_judged_before_they_train(tmp_path: Path) -> None:
    """Cold start (asked for: off by default): each client first evaluates the
    global model on its own data; the store's cold_start rows equal the
    simulator's evaluation of the initial model on each client's data."""
    from fedforge.evaluation.evaluate import evaluate
    from fedforge.server.experiment import build

    cfg = write_config(tmp_path / "cfg.yaml", rounds=1, deployment={"cold_start": True})
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-2", "3-5")]
    assert server.wait(180) == 0, server.log.read_text()
    for c in clients:
        c.wait(60)
    with sqlite3.connect(tmp_path / run_dir_of(server) / "store.sqlite") as db:
        rows = db.execute(
            "SELECT round_idx, client_id, accuracy, loss, num_examples "
            "FROM cold_start ORDER BY client_id"
        ).fetchall()
    exp = build(config_mod.load(cfg))
    assert [r[1] for r in rows] == list(range(6)) and {r[0] for r in rows} == {0}
    for _, c, acc, loss, n in rows:
        x, y = exp.data.client_data(c)
        ev = evaluate(exp.model, exp.spec, exp.initial_params, x, y, 250, exp.metrics)
        assert n == len(y) and acc == pytest.approx(ev.accuracy, abs=1e-12)
        assert loss == pytest.approx(ev.loss, rel=1e-9)


@pytest.mark.parametrize(
    "lr,verdict", [pytest.param(0.05, "promoted", marks=pytest.mark.slow), (40.0, "rolled_back")]
)
def test_canary_promotes_a_better_model_and_rolls_back_a_worse_one(
    tmp_path: Path, lr: float, verdict: str
) -> None:
    """Every round's model is a candidate judged on every client's data (loss,
    at most 0.001 worse for the median client): at a sane step size each is
    promoted; at a step size that blows the model up each is rolled back and the
    first model stays served. Every client trains each round (client_fraction
    1): on these non-IID clients a model trained by half of them can be worse
    for the other half, the median client among them. A version's parameters
    are the simulator's model after that many rounds."""
    from fedforge.store import RunStore
    from fedforge.store import versions as vs

    dep = {
        "canary_every": 1,
        "canary_fraction": 1.0,
        "canary_metric": "loss",
        "canary_max_drop": 0.001,
        "canary_min_reports": 6,
    }
    cfg = write_config(tmp_path / "cfg.yaml", lr=lr, rounds=3, client_fraction=1.0, deployment=dep)
    server, port = start_server(tmp_path, cfg, "--insecure")
    hosts = {"0-2": tmp_path / "state-a", "3-5": tmp_path / "state-b"}
    clients = [
        start_client(tmp_path, port, ids, "--insecure", "--state-dir", str(d))
        for ids, d in hosts.items()
    ]
    assert server.wait(180) == 0, server.log.read_text()
    for c in clients:
        c.wait(60)
    with RunStore.open(tmp_path / run_dir_of(server), read_only=True) as store:
        versions = vs.list_versions(store)
        assert [v.round_idx for v in versions] == [0, 1, 2]
        assert versions[0].status in ("promoted", "superseded")
        assert [v.status for v in versions[1:]] == (
            ["superseded", "promoted"] if verdict == "promoted" else ["rolled_back"] * 2
        )
        for v in versions[1:]:
            params = vs.load_version_params(store, v.version_id)
            sim = config_mod.override(
                config_mod.load(cfg), {"rounds": v.round_idx, "runs_dir": str(tmp_path / "sim")}
            )
            assert (params - run(sim).params).abs().max().item() <= 1e-9
        live = vs.serving(store)
        if verdict == "rolled_back":
            assert live.version_id == versions[0].version_id
        served = vs.load_version_params(store, live.version_id)
    # every client keeps the serving version for its own inference, as the model's
    # named tensors: loaded into the model they are the store's version
    model = build(config_mod.load(cfg)).model
    spec = ParamSpec.of(model, include_buffers=True)
    for ids, folder in hosts.items():
        first, last = (int(x) for x in ids.split("-"))
        for c in range(first, last + 1):
            version_id, named = load_serving(folder, c)
            assert version_id == live.version_id
            model.load_state_dict(named)
            assert torch.equal(spec.flatten(model, served.dtype), served)
        assert len(list(folder.glob("serving-*-v*.safetensors"))) == 1  # older ones removed
    decisions = [e for e in server.events() if e.get("event") == "canary"]
    said = {"promoted": "promote", "rolled_back": "rollback"}[verdict]
    assert [d["decision"] for d in decisions] == [said] * 2


@pytest.mark.slow
def test_over_selection_asks_more_and_closes_at_the_needed_count(tmp_path: Path) -> None:
    """C = 0.5 of 6 needs 3 updates; over-selection 1.0 asks all 6 and closes each
    round at the first 3 taken."""
    cfg = write_config(tmp_path / "cfg.yaml", deployment={"over_selection": 1.0})
    server, port = start_server(tmp_path, cfg, "--insecure")
    clients = [start_client(tmp_path, port, ids, "--insecure") for ids in ("0-1", "2-3", "4-5")]
    assert server.wait(180) == 0, server.log.read_text()
    for c in clients:
        c.wait(60)
    with sqlite3.connect(tmp_path / run_dir_of(server) / "store.sqlite") as db:
        asked = [r[0] for r in db.execute("SELECT cohort_size FROM rounds ORDER BY round_idx")]
        used = db.execute(
            "SELECT round_idx, COUNT(*) FROM client_rounds GROUP BY round_idx ORDER BY round_idx"
        ).fetchall()
    assert asked == [6, 6, 6]
    assert [n for _, n in used] == [3, 3, 3]
