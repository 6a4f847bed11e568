"""Config: YAML in, dotted overrides, unknown fields with a suggestion, bad values
named in the error, FedSGD's forced E and B, round trips, and every shipped config."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedforge.config import (
    Config,
    FedProxConfig,
    PartitionConfig,
    ServerOptimizerConfig,
    dump,
    from_dict,
    load,
    override,
    parse_override,
    to_dict,
)
from fedforge.config.overrides import with_overrides
from fedforge.core.errors import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_yaml_load(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: tiny\nmodel: 2nn\nnum_clients: 4\npartition: {kind: dirichlet, alpha: 0.3}\n"
        "client_fraction: 0.5\nlocal_epochs: 5\nbatch_size: null\nlr: 0.05\nrounds: 2\n",
    )
    cfg = load(path)
    assert cfg.name == "tiny" and cfg.model == "2nn" and cfg.num_clients == 4
    assert cfg.partition == PartitionConfig(kind="dirichlet", alpha=0.3)
    assert cfg.client_fraction == 0.5 and cfg.local_epochs == 5
    assert cfg.batch_size is None and cfg.lr == 0.05 and cfg.rounds == 2
    # Fields not in the file keep their defaults.
    assert cfg.seed == Config().seed and cfg.server_optimizer.lr == 1.0


def test_empty_yaml_is_the_defaults(tmp_path: Path) -> None:
    assert load(write(tmp_path, "")) == Config()


def test_integer_accepted_for_a_float_field(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, "lr: 1\n"))
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)


def test_batch_size_all_means_whole_data_set() -> None:
    assert from_dict({"batch_size": "all"}).batch_size is None
    assert from_dict({"batch_size": None}).batch_size is None
    assert from_dict({"batch_size": 50}).batch_size == 50


@pytest.mark.parametrize(
    "text, expected",
    [
        ("partition.alpha=0.3", ("partition.alpha", 0.3)),
        ("local_epochs=5", ("local_epochs", 5)),
        ("batch_size=null", ("batch_size", None)),
        ("model=2nn", ("model", "2nn")),
        ("target_accuracy=0.99", ("target_accuracy", 0.99)),
        (" lr = 0.01", ("lr", 0.01)),
    ],
)
def test_parse_override(text: str, expected: tuple[str, Any]) -> None:
    assert parse_override(text) == expected


def test_exponent_notation_is_a_number(tmp_path: Path) -> None:
    assert load(write(tmp_path, "lr: 1e-3\n")).lr == 0.001
    assert override(Config(), dict([parse_override("lr=1e-3")])).lr == 0.001


def test_parse_override_needs_equals() -> None:
    with pytest.raises(ConfigError, match="field=value"):
        parse_override("local_epochs")


def test_dotted_override() -> None:
    base = Config(partition=PartitionConfig(kind="dirichlet"))
    cfg = override(base, dict([parse_override("partition.alpha=0.3"), ("rounds", 7)]))
    assert cfg.partition.alpha == 0.3 and cfg.partition.kind == "dirichlet"
    assert cfg.rounds == 7
    # The original is frozen and unchanged.
    assert base.partition.alpha == 0.5 and base.rounds == 60
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.rounds = 3  # type: ignore[misc]


def test_override_is_validated_again() -> None:
    with pytest.raises(ConfigError, match="'partition.alpha'"):
        override(Config(), {"partition.alpha": 0})


@pytest.mark.parametrize(
    "data, field, suggestion",
    [
        ({"local_epoch": 5}, "local_epoch", "local_epochs"),
        ({"clients_fraction": 0.1}, "clients_fraction", "client_fraction"),
        ({"partition": {"alpah": 0.3}}, "partition.alpah", "partition.alpha"),
    ],
)
def test_unknown_field_is_named_with_a_suggestion(
    data: dict[str, Any], field: str, suggestion: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        from_dict(data)
    message = str(exc.value)
    assert f"'{field}'" in message
    assert f"did you mean '{suggestion}'" in message


def test_unknown_field_from_yaml_and_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'lerning_rate'"):
        load(write(tmp_path, "lerning_rate: 0.1\n"))
    with pytest.raises(ConfigError, match="did you mean 'partition.alpha'"):
        override(Config(), {"partition.alpah": 0.3})
    with pytest.raises(ConfigError, match="'partiton'"):
        override(Config(), {"partiton.alpha": 0.3})


@pytest.mark.parametrize(
    "data, field",
    [
        ({"lr": -0.1}, "lr"),
        ({"lr": 0}, "lr"),
        ({"lr": "fast"}, "lr"),
        ({"client_fraction": 1.5}, "client_fraction"),
        ({"client_fraction": 0.0}, "client_fraction"),
        ({"partition": {"alpha": 0.0}}, "partition.alpha"),
        ({"partition": {"alpha": -1.0}}, "partition.alpha"),
        ({"partition": {"kind": "random"}}, "partition.kind"),
        ({"partition": "iid"}, "partition"),
        ({"algorithm": "fedprox2"}, "algorithm"),
        ({"model": ""}, "model"),  # which names exist is checked at build
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 2.5}, "num_clients"),
        ({"local_epochs": True}, "local_epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"rounds": 0}, "rounds"),
        ({"target_accuracy": 99}, "target_accuracy"),
        ({"lr_decay": 1.5}, "lr_decay"),
        ({"server_optimizer": {"lr": -1}}, "server_optimizer.lr"),
        ({"dtype": "float16"}, "dtype"),
        ({"name": "a/b"}, "name"),
        ({"name": "a\x00b"}, "name"),  # a NUL byte: a traceback at mkdir
        ({"name": "a\nb"}, "name"),  # a folder a run table splits in two
        ({"name": "x" * 201}, "name"),  # failed at mkdir, after loading the data
        ({"runs_dir": ""}, "runs_dir"),  # wrote runs into the current folder
        ({"runs_dir": "  "}, "runs_dir"),
        ({"target_accuracy": "all"}, "target_accuracy"),  # 'all' is null for batch_size only
        ({"robust": {"attack": "alie", "alie_z": float("nan")}}, "robust.alie_z"),
        ({"robust": {"attack": "scaled", "attack_scale": float("inf")}}, "robust.attack_scale"),
    ],
)
def test_bad_value_names_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        from_dict(data)
    message = str(exc.value)
    assert f"'{field}'" in message
    assert "\n" not in message


def test_bad_value_from_the_constructor() -> None:
    with pytest.raises(ConfigError, match="'client_fraction'"):
        Config(client_fraction=1.5)


def test_unknown_algorithm_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        from_dict({"algorithm": "fedfoo"})
    assert "'fedavg'" in str(exc.value) and "'fedsgd'" in str(exc.value)


def test_fedsgd_forces_one_epoch_full_batch() -> None:
    cfg = from_dict({"algorithm": "fedsgd", "local_epochs": 5, "batch_size": 10})
    assert cfg.local_epochs == 1 and cfg.batch_size is None
    assert Config(algorithm="fedsgd").batch_size is None
    # Switching an existing FedAvg config to FedSGD does the same.
    cfg = override(Config(local_epochs=20, batch_size=50), {"algorithm": "fedsgd"})
    assert (cfg.local_epochs, cfg.batch_size) == (1, None)
    # FedAvg keeps what it was given.
    cfg = from_dict({"algorithm": "fedavg", "local_epochs": 5, "batch_size": 10})
    assert (cfg.local_epochs, cfg.batch_size) == (5, 10)


def test_dict_and_yaml_round_trip() -> None:
    cfg = Config(
        name="rt",
        seed=7,
        model="2nn",
        partition=PartitionConfig(
            kind="shards", shards_per_client=3, feature_shift=("blur", "invert")
        ),
        batch_size=None,
        target_accuracy=None,
        dtype="float64",
    )
    data = to_dict(cfg)
    assert data["partition"] == {
        "kind": "shards",
        "shards_per_client": 3,
        "alpha": 0.5,
        "sigma": 1.0,
        "min_size": 1,
        "feature_shift": ["blur", "invert"],  # a list, so that YAML and JSON hold it
        "label_noise": 0.0,
        "concept_shift": 0,
        "label_noise_rule": "symmetric",
        "label_noise_rate": 1.0,
    }
    assert from_dict(data) == cfg
    assert from_dict(yaml.safe_load(dump(cfg))) == cfg
    assert from_dict(to_dict(Config())) == Config()


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(write(tmp_path, "lr: [0.1\n"))
    with pytest.raises(ConfigError, match="mapping"):
        load(write(tmp_path, "- 1\n- 2\n"))


# A shipped config named like McMahan's table rows: {model}_{iid|noniid}_{e<E>_b<B|inf>|fedsgd},
# prefixed scaled01_ when its inputs are MNIST's pixels in [0, 1].
_NAME = re.compile(r"^(scaled01_)?(cnn|2nn)_(iid|noniid)_(?:e(\d+)_b(\d+|inf)|(fedsgd))$")


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load(path)
    assert from_dict(to_dict(cfg)) == cfg
    match = _NAME.match(path.stem)
    if match is None:
        return
    # The file name promises a table row: the content must be that row.
    scaled, model, split, epochs, batch, fedsgd = match.groups()
    assert cfg.name == path.stem
    assert cfg.input_scaling == ("unit" if scaled else "standard")
    assert cfg.model == model
    assert cfg.partition.kind == ("iid" if split == "iid" else "shards")
    if fedsgd:
        assert cfg.algorithm == "fedsgd"
        assert (cfg.local_epochs, cfg.batch_size) == (1, None)
    else:
        assert cfg.algorithm == "fedavg"
        assert cfg.local_epochs == int(epochs)
        assert cfg.batch_size == (None if batch == "inf" else int(batch))


def test_there_are_shipped_configs() -> None:
    if not CONFIGS:
        pytest.skip("no configs/*.yaml")
    assert any(p.name == "default.yaml" for p in CONFIGS)


def test_fields_a_run_does_not_read_are_named_not_refused() -> None:
    """A sweep over the algorithm or the optimizer kind keeps one setting for the
    points that read it: the others run, and say what they ignore."""
    from fedforge.config.notes import config_notes

    assert config_notes(Config()) == []
    assert config_notes(Config(algorithm="fedprox", fedprox=FedProxConfig(mu=0.5))) == []
    mu = ["fedprox.mu = 0.5 is ignored by algorithm 'fedavg'"]
    assert config_notes(Config(fedprox=FedProxConfig(mu=0.5))) == mu
    so = ServerOptimizerConfig(kind="adagrad", beta2=0.5, momentum=0.9)
    assert config_notes(Config(server_optimizer=so)) == [
        "server_optimizer.momentum = 0.9 is ignored by kind 'adagrad'",
        "server_optimizer.beta2 = 0.5 is ignored by kind 'adagrad'",
    ]


def test_scaffold_option_ii_with_momentum_is_named() -> None:
    """Option II's control variate is the displacement over steps * lr, the mean
    corrected gradient only under plain SGD: momentum or weight decay is noted."""
    from fedforge.config.local import LocalConfig, ScaffoldConfig
    from fedforge.config.notes import config_notes

    plain = Config(algorithm="scaffold")
    assert config_notes(plain) == []
    heavy = Config(algorithm="scaffold", local=LocalConfig(momentum=0.9))
    (note,) = config_notes(heavy)
    assert "option 'II'" in note and "local.momentum = 0.9" in note
    option_i = Config(
        algorithm="scaffold",
        local=LocalConfig(weight_decay=0.1),
        scaffold=ScaffoldConfig(option="I"),
    )
    assert config_notes(option_i) == []
    assert config_notes(Config(local=LocalConfig(momentum=0.9))) == []


def test_yaml_merge_keys_are_read(tmp_path: Path) -> None:
    """``<<: *base`` merges a mapping; the keys beside it override it, and a key
    twice in the mapping itself is still refused."""
    partition = "partition: {<<: {alpha: 0.3, kind: dirichlet}, alpha: 0.7}\n"
    cfg = load(write(tmp_path, "lr: 0.2\n" + partition))
    assert cfg.partition.alpha == 0.7 and cfg.partition.kind == "dirichlet"
    with pytest.raises(ConfigError, match="given twice"):
        load(write(tmp_path, "partition: {<<: {kind: iid}, alpha: 0.7, alpha: 0.5}\n"))


def test_fedbn_says_what_its_global_accuracy_measures() -> None:
    from fedforge.config.notes import config_notes

    (note,) = config_notes(Config(algorithm="fedbn", model="cnn_bn"))
    assert note.startswith("fedbn: the global test accuracy") and "evaluation.clients" in note


def test_synthetic_iid_names_the_alpha_and_beta_it_ignores() -> None:
    from fedforge.config.data import SyntheticConfig
    from fedforge.config.notes import config_notes

    base = {"dataset": "synthetic", "model": "logreg"}
    assert config_notes(Config(**base, synthetic=SyntheticConfig(iid=True))) == []  # type: ignore[arg-type]
    notes = config_notes(Config(**base, synthetic=SyntheticConfig(beta=0.5, iid=True)))  # type: ignore[arg-type]
    assert notes == ["synthetic.beta = 0.5 is ignored by synthetic.iid"]


def test_privacy_settings_without_dp_are_named() -> None:
    from fedforge.config.notes import config_notes

    notes = config_notes(from_dict({"privacy": {"noise_multiplier": 2.0, "delta": 1e-6}}))
    assert notes == [
        "privacy.noise_multiplier = 2.0 is ignored with privacy.dp 'none'",
        "privacy.delta = 1e-06 is ignored with privacy.dp 'none'",
    ]
    notes = config_notes(from_dict({"privacy": {"secret_noise": True}}))
    assert notes == ["privacy.secret_noise = True is ignored with privacy.dp 'none'"]
    tiers = {"tiers": {"high_fraction": 0.5}, "secagg": True, "noise_multiplier": 2.0}
    notes = config_notes(from_dict({"privacy": tiers}))  # tiers noise the high tier
    assert len(notes) == 1 and "derived from the run seed" in notes[0]
    assert config_notes(from_dict({"privacy": {**tiers, "secret_noise": True}})) == []


def test_robust_settings_the_aggregator_does_not_read_are_named() -> None:
    from fedforge.config.notes import config_notes

    robust = {"aggregator": "median", "byzantine": 2, "trim_fraction": 0.2}
    assert config_notes(from_dict({"robust": robust})) == [
        "robust.byzantine = 2 is ignored by robust.aggregator 'median'",
        "robust.trim_fraction = 0.2 is ignored by robust.aggregator 'median'",
    ]
    assert config_notes(from_dict({"robust": {**robust, "aggregator": "trimmed_mean"}})) == [
        "robust.byzantine = 2 is ignored by robust.aggregator 'trimmed_mean'"
    ]
    krum = {"aggregator": "krum", "byzantine": 2}
    assert config_notes(from_dict({"robust": krum})) == []


def test_a_weight_cap_no_rule_reads_is_named() -> None:
    from fedforge.config.notes import config_notes

    (note,) = config_notes(from_dict({"aggregation": {"weight_cap": 50}}))
    assert note.startswith(
        "aggregation.weight_cap = 50 is ignored by aggregation.weights 'num_examples'"
    )
    assert config_notes(from_dict({"aggregation": {"weight_cap": 50, "weights": "quality"}})) == []


def test_a_number_past_floats_range_is_a_config_error() -> None:
    """10**400 (an int YAML or --set reads) overflowed float() inside validation:
    an OverflowError traceback instead of the one-line error."""
    for name in ("lr", "client_fraction", "target_accuracy"):
        with pytest.raises(ConfigError, match=f"'{name}' = 1000.*must be a finite number"):
            from_dict({name: 10**400})
    # past Python's 4,300 digits even repr() fails: the message says so instead
    with pytest.raises(ConfigError, match="'lr' = <int of about 5000 digits, too long"):
        from_dict({"lr": 10**5000})


def test_a_yaml_integer_past_pythons_digit_limit_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("lr: 1" + "0" * 5000 + "\n")
    with pytest.raises(ConfigError, match="holds a value YAML cannot read"):
        load(path)
    # finite, but past float32: round 1 crashed converting it (after the run began)
    for name in ("lr", "server_optimizer.lr"):
        with pytest.raises(ConfigError, match=f"'{name}' = 1e\\+300.*below 3.4e38 in a float32"):
            from_dict(with_overrides({}, {name: 1e300}))
        cfg = from_dict(with_overrides({"dtype": "float64"}, {name: 1e300}))
        assert cfg.lr == 1e300 or cfg.server_optimizer.lr == 1e300
    # FedProx's mu and weight decay are steps too (lr * mu each step): 1e20 each
    # was valid alone and crashed round 1 together
    prox = {"fedprox": {"mu": 1e20}}
    for field in (
        {"fedprox": {"mu": 1e300}},
        {"lr": 1e20, **prox},
        {"local": {"weight_decay": 1e300}},
    ):
        with pytest.raises(ConfigError, match=r"below 3\.4e38 in a float32 run"):
            from_dict(field)
    from_dict({"lr": 1e20, **prox, "dtype": "float64"})
