"""Local DP in a deployment, from the server's side: it picks the run seed and
sends it with the config, so noise derived from the seed is noise it can draw
again and subtract. Real ``fedforge server`` and ``fedforge client`` processes
on loopback, one client in one round: the update the server received is the
final model's move, and the clean update is the simulator's without DP."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch

from deploy_procs import Proc, run_dir_of, start_client, start_server, write_config
from fedforge import config as config_mod
from fedforge import run
from fedforge.core.rng import torch_generator
from fedforge.store import RunStore
from fedforge.store.final import load_final

Z, CLIP = 0.02, 500.0  # a clip bound no update reaches: the clipped update is the update
PRIVATE: dict[str, Any] = {
    "num_clients": 2,
    "client_fraction": 0.5,  # one client a round: the aggregate is its upload
    "rounds": 1,
    "privacy": {"dp": "local", "noise_multiplier": Z, "clip_norm": CLIP},
    "deployment": {"cold_start": False},  # refused with local DP
}


def _config(tmp: Path, **privacy: Any) -> Path:
    fields = {**PRIVATE, "privacy": {**PRIVATE["privacy"], **privacy}}
    return write_config(tmp / "cfg.yaml", **fields)


def _deploy(tmp: Path, privacy: dict[str, Any], *client_args: str) -> tuple[Path, Proc, Proc]:
    cfg = _config(tmp, **privacy)
    server, port = start_server(tmp, cfg, "--insecure")
    client = start_client(tmp, port, "0-1", "--insecure", *client_args)
    assert server.wait(180) == 0, server.log.read_text()
    assert client.wait(60) == 0, client.log.read_text()
    return cfg, server, client


def _stripped_and_clean(
    tmp: Path, cfg_path: Path, server: Proc
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the server gets by subtracting the noise it derives from the config and
    seed (as the simulator draws local DP's: purpose "local_dp", round, client),
    and the model the clean update makes (the simulator's run without DP)."""
    run_dir = tmp / run_dir_of(server)
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        (client,) = [c for (c,) in db.execute("SELECT client_id FROM client_rounds")]
    cfg = config_mod.load(cfg_path)
    deployed = load_final(run_dir)["params"]
    gen = torch_generator(cfg.seed, "local_dp", 0, client)
    noise = torch.randn(deployed.shape, generator=gen, dtype=torch.float64) * (Z * CLIP)
    stripped = deployed - cfg.server_optimizer.lr * noise
    clean_cfg = config_mod.override(cfg, {"runs_dir": str(tmp / "sim"), "privacy.dp": "none"})
    return stripped, run(clean_cfg).params


def test_with_the_defaults_the_server_cannot_subtract_a_clients_noise(tmp_path: Path) -> None:
    cfg, server, client = _deploy(tmp_path, {})
    stripped, clean = _stripped_and_clean(tmp_path, cfg, server)
    residual = stripped - clean
    # two independent N(0, (z C)^2) draws a coordinate remain: the client's, and
    # the server's guess of it; their difference has std sqrt(2) z C
    expected = math.sqrt(2) * Z * CLIP
    worst, spread = residual.abs().max().item(), residual.std().item()
    print(f"default: max |stripped - clean| {worst:.4g}, std {spread:.4g} (sqrt(2) z C = ", end="")
    print(f"{expected:.4g}), {residual.numel()} coordinates")
    assert worst > expected
    assert abs(spread / expected - 1) < 0.15
    with RunStore.open(tmp_path / run_dir_of(server), read_only=True) as stored:
        assert stored.config().privacy.secret_noise is True  # what the run used
    assert not [e for e in server.events() if e.get("event") == "noise_not_secret"]


@pytest.mark.slow
@pytest.mark.parametrize("trusting_client", [True, False])
def test_a_trusted_server_recomputes_only_the_noise_of_a_client_that_trusts_it(
    tmp_path: Path, trusting_client: bool
) -> None:
    """With ``trusted_server_noise`` the server asks for seed-derived noise and says
    at start that it can recompute it; a client follows only with its operator's
    ``--trust-server-noise`` (the exact recovery there checks the recovery itself),
    else it draws from the OS and says why."""
    flags = ["--trust-server-noise"] if trusting_client else []
    privacy = {"secret_noise": False, "trusted_server_noise": True}
    cfg, server, client = _deploy(tmp_path, privacy, *flags)
    said = [e for e in server.events() if e.get("event") == "noise_not_secret"]
    assert len(said) == 1 and "the server can recompute the clients' noise" in said[0]["warning"]
    stripped, clean = _stripped_and_clean(tmp_path, cfg, server)
    error = (stripped - clean).abs().max().item()
    kept = [e for e in client.events() if e.get("event") == "noise_kept_secret"]
    print(f"trusted server, trusting client {trusting_client}: max |stripped - clean| {error:.4g}")
    if trusting_client:
        assert error <= 1e-9
        assert not kept
    else:
        assert error > math.sqrt(2) * Z * CLIP
        assert len(kept) == 1 and "--trust-server-noise" in kept[0]["warning"]


@pytest.mark.parametrize("dp", ["local", "central"])
def test_a_server_refuses_seed_derived_noise_it_is_not_trusted_with(
    tmp_path: Path, dp: str
) -> None:
    cfg = _config(tmp_path, dp=dp, secret_noise=False)
    who = "every client" if dp == "central" else "the server can recompute"
    with pytest.raises(AssertionError, match="privacy.trusted_server_noise: true") as err:
        start_server(tmp_path, cfg, "--insecure")
    assert "'privacy.secret_noise' = False" in str(err.value) and who in str(err.value)


@pytest.mark.parametrize(
    ("sent", "trust", "secret", "says"),
    [
        (False, False, True, True),  # a server asking for noise it can recompute: refused
        (False, True, False, False),  # ... unless this client's operator trusts it
        (None, True, True, False),  # unsaid: a deployment's default, the OS
        (True, False, True, False),
    ],
)
def test_a_client_takes_seed_derived_noise_only_from_its_own_operator(
    sent: bool | None, trust: bool, secret: bool, says: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the client runs from the config a server sends, whatever that server
    claims about being trusted (``trusted_server_noise`` is the server's word)."""
    import yaml

    from fedforge.transport.hosted import client_config

    privacy = {"dp": "local", "secret_noise": sent, "trusted_server_noise": True}
    sent_yaml = yaml.safe_dump({"dataset": "synthetic", "model": "logreg", "privacy": privacy})
    cfg = client_config(sent_yaml, "cpu", trust_server_noise=trust)
    assert cfg.privacy.secret_noise is secret
    assert ("noise_kept_secret" in capsys.readouterr().err) is says


def test_secure_aggregation_secrets_do_not_come_from_the_seed() -> None:
    """Two clients in the same (client, round) of the same run: a client's keys and
    self-mask seed are its own OS randomness, never a function of what the
    server knows (the config, the seed, the round, the cohort)."""
    from fedforge.privacy.secagg import SecAggClient
    from fedforge.privacy.secagg_masks import FixedPoint

    fp = FixedPoint(frac_bits=20, bits=40)
    a, b = SecAggClient(3, 0, 2, fp), SecAggClient(3, 0, 2, fp)
    assert a.advertise()[0] != b.advertise()[0] and a.advertise()[1] != b.advertise()[1]
    assert a.b != b.b and len(a.b) == 32


def _hosted(**privacy: Any) -> Any:
    from fedforge.config.parse import from_dict
    from fedforge.server.experiment import build

    fields = {"dataset": "synthetic", "model": "logreg", "num_clients": 6, "client_fraction": 0.5}
    return build(from_dict({**fields, "privacy": privacy}))


@pytest.mark.parametrize(
    ("privacy", "added"),
    [
        ({"dp": "local", "noise_multiplier": 0.8}, {0: 0.8, 4: 0.8}),
        # a cohort of 3, t = ceil(0.66 * 3) = 2: each adds z / sqrt(2)
        ({"dp": "distributed", "noise_multiplier": 0.8, "secagg": True}, {0: 0.8 / math.sqrt(2)}),
        ({"secagg": True, "noise_multiplier": 0.8, "tiers": {"high_clients": [4]}}, {0: 0, 4: 0.8}),
        ({"dp": "central", "noise_multiplier": 0.8}, {0: 0.0}),  # the server's noise
        ({"dp": "none"}, {0: 0.0}),
    ],
)
def test_a_client_can_refuse_a_config_that_noises_it_less_than_its_floor(
    privacy: dict[str, Any], added: dict[int, float]
) -> None:
    from fedforge.core.errors import ConfigError
    from fedforge.transport.hosted import check_noise_floor

    exp = _hosted(**privacy)
    for client, z in added.items():
        check_noise_floor(exp, [client], z * 0.999)  # at its own noise: trains
        with pytest.raises(ConfigError, match=f"client {client}: {z:g}"):
            check_noise_floor(exp, [client], z * 1.001 + 1e-9)
    check_noise_floor(exp, list(added), 0.0)  # no floor: anything goes


def test_a_server_that_drops_the_noise_is_refused_by_a_client_with_a_floor(
    tmp_path: Path,
) -> None:
    """A server wanting clean updates need only send privacy.dp: none; a client
    whose operator set --min-noise-multiplier does not train for it."""
    cfg = _config(tmp_path, dp="none")
    server, port = start_server(tmp_path, cfg, "--insecure")
    try:
        client = start_client(tmp_path, port, "0-1", "--insecure", "--min-noise-multiplier", "0.5")
        assert client.wait(60) == 2
        said = client.log.read_text()
        assert "--min-noise-multiplier 0.5" in said and "privacy.dp = 'none'" in said
        assert not [e for e in client.events() if e.get("event") == "joined"]
    finally:
        server.kill()


def test_a_resumed_run_with_seed_derived_noise_is_said_at_start(tmp_path: Path) -> None:
    """A stored config keeps its noise (a simulation's default, or an older
    server's): the resumed server says who can recompute it, and serves."""
    cfg = config_mod.override(config_mod.load(_config(tmp_path)), {"runs_dir": str(tmp_path / "s")})
    stored = run(cfg).run_dir
    server, _ = start_server(tmp_path, None, "--resume", str(stored), "--insecure")
    server.kill()
    said = [e for e in server.events() if e.get("event") == "noise_not_secret"]
    assert len(said) == 1
    assert said[0]["warning"].startswith("the run's stored config (privacy.secret_noise = None)")


@pytest.mark.parametrize("floor", ["-1", "nan", "inf"])
def test_a_floor_that_is_not_a_number_of_at_least_0_is_refused(
    floor: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedforge.cli import main

    argv = ["client", "--server", "127.0.0.1:1", "--clients", "0", "--insecure"]
    assert main([*argv, "--min-noise-multiplier", floor]) == 2
    assert f"--min-noise-multiplier {float(floor)} is invalid" in capsys.readouterr().err


def test_the_run_notes_name_the_noise_settings_that_do_nothing() -> None:
    from fedforge.config.notes import config_notes
    from fedforge.config.parse import from_dict

    trusted = {"trusted_server_noise": True}
    assert config_notes(from_dict({"privacy": trusted})) == [
        "privacy.trusted_server_noise = True is ignored with privacy.dp 'none'"
    ]
    local = {"dp": "local", **trusted}
    notes = config_notes(from_dict({"privacy": {**local, "secret_noise": True}}))
    assert notes == [
        "privacy.trusted_server_noise = True is ignored unless privacy.secret_noise = false "
        "(it allows seed-derived noise in a `fedforge server` run)"
    ]
    notes = config_notes(from_dict({"privacy": {**local, "secret_noise": False}}))
    assert len(notes) == 1 and "derived from the run seed" in notes[0]


def test_a_sweep_reuses_a_run_whose_noise_was_seed_derived_by_choice(
    tmp_path: Path, one_thread: None
) -> None:
    """A run stored with secret_noise false drew what the default (null) draws
    in a simulation: the same job, reused; one with secret noise is not."""
    from fedforge.config.parse import from_dict
    from fedforge.server.sweep import run_sweep

    tiny = {"dataset": "synthetic", "model": "logreg", "num_clients": 4, "rounds": 1}
    private = {"dp": "local", "noise_multiplier": 1.0}
    grid = [("lr", [0.01])]

    def sweep(secret: bool | None) -> Any:
        privacy = {**private, "secret_noise": secret}
        cfg = from_dict({**tiny, "runs_dir": str(tmp_path), "privacy": privacy})
        (point,) = run_sweep(cfg, grid)
        return point.status

    assert [sweep(False), sweep(None), sweep(True)] == ["finished", "reused", "finished"]
