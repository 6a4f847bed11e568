"""A client's own data (``fedforge client --data PATH``) and a server that holds
none (``deployment.client_data: remote``), in one process: the folder's format
and its one-line errors, the check against the server's data spec, the config
rules of the mode, and the sizes the server takes from the clients' joins."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedforge import config as config_mod
from fedforge.cli import main
from fedforge.core.dataspec import DataSpec
from fedforge.core.errors import ConfigError, DataError
from fedforge.data.folder import ClientFolder, Examples, own_data, read_folders
from fedforge.server.experiment import build
from fedforge.server.partition_file import partition_summary
from fedforge.server.registry import Registry
from fedforge.tasks import load_server_data
from fedforge.transport.hosted import build_hosted, evaluation_data
from fedforge.transport.hub import Hub
from fedforge.transport.remote import RemoteEngine

SPEC = DataSpec((3,), torch.float32, (), 4)
REMOTE = {
    "dataset": "synthetic",
    "model": "logreg",
    "num_clients": 3,
    "dtype": "float64",
    "deployment.client_data": "remote",
    "robust.max_weight_ratio": 10.0,
}


def _client(tmp: Path, *args: str) -> int:
    return main(["client", "--server", "127.0.0.1:1", "--insecure", *args])


def _save(folder: Path, name: str = "train.npz", **arrays: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / name, **arrays)  # type: ignore[arg-type]
    return folder


def _npy_named_npz(folder: Path) -> Path:
    """One array saved with np.save, under the name train.npz."""
    with (folder / "train.npz").open("wb") as f:
        np.save(f, np.zeros((2, 3)))
    return folder


def _corrupted(folder: Path) -> Path:
    """A np.savez_compressed file whose x's deflate stream is overwritten: a
    well-formed zip whose data cannot be inflated (zlib's error)."""
    path = folder / "train.npz"
    np.savez_compressed(path, x=np.arange(3000.0).reshape(1000, 3), y=np.zeros(1000, np.int64))
    raw = bytearray(path.read_bytes())
    raw[100:140] = b"\xff" * 40  # x.npy's member is first: its compressed bytes
    path.write_bytes(bytes(raw))
    return folder


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda d: d / "absent", "absent: no such folder"),
        (lambda d: d, "train.npz: no such file; the folder needs train.npz (x, y)"),
        (
            lambda d: _save(d, x=np.zeros((2, 3)), label=np.zeros(2)),
            "holds arrays label, x; it must hold exactly x (the inputs) and y (the labels)",
        ),
        (
            lambda d: _save(d, x=np.zeros((2, 3)), y=np.zeros(3, np.int64)),
            "array x has 2 rows but array y has 3; one label a row",
        ),
        (
            lambda d: _save(d, x=np.zeros((0, 3)), y=np.zeros(0, np.int64)),
            "no examples (x has 0 rows); a client needs at least one",
        ),
        (
            lambda d: (d / "train.npz").write_bytes(b"not a zip") and d,
            "not a readable .npz file of arrays x and y",
        ),
        (
            _npy_named_npz,
            "train.npz: a single array (.npy), not an .npz file of arrays x and y (write it "
            "with np.savez(path, x=x, y=y))",
        ),
        (
            _corrupted,
            "train.npz: not a readable .npz file of arrays x and y (Error -3 while "
            "decompressing data",
        ),
    ],
)
def test_a_bad_folder_is_refused_in_one_line_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, said: str
) -> None:
    folder = make(tmp_path)  # type: ignore[operator]
    assert _client(tmp_path, "--data", str(folder), "--client-id", "0") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("fedforge: error: ") and said in err


def test_one_id_reads_its_folder_and_several_a_folder_each_said_when_mixed_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--client-id 5 reads PATH itself; --client-id 5,6 reads PATH/5/ and PATH/6/:
    a folder laid out for the other is refused with the --data that reads it."""
    site, own = tmp_path / "site", tmp_path / "own"
    for k in (5, 6):
        _save(site / str(k), x=np.zeros((2, 3)), y=np.zeros(2, np.int64))
    _save(own, x=np.zeros((2, 3)), y=np.zeros(2, np.int64))
    assert _client(tmp_path, "--data", str(site), "--client-id", "5") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"fedforge: error: --data {site}: no train.npz; with one --client-id the folder is "
        f"the client's own: --data {site / '5'}"
    )
    assert _client(tmp_path, "--data", str(own), "--client-id", "5,6") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"fedforge: error: --data {own}: one client's folder (train.npz); with several "
        f"--client-id ids it holds a folder <id>/ per client ({own / '5' / 'train.npz'}, ...)"
    )
    assert set(read_folders(site, [5, 6])) == {5, 6}
    assert read_folders(own, [5])[5].train.path == own / "train.npz"


def test_data_and_client_id_go_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _save(tmp_path / "d", x=np.zeros((2, 3)), y=np.zeros(2, np.int64))
    assert _client(tmp_path, "--data", str(folder)) == 2
    assert "--data needs --client-id N" in capsys.readouterr().err
    assert _client(tmp_path, "--clients", "0-1", "--client-id", "0") == 2
    assert "--client-id N goes with --data PATH" in capsys.readouterr().err


def _examples(x: np.ndarray, y: np.ndarray) -> ClientFolder:
    return ClientFolder(Examples(x, y, Path("own/train.npz")), None)


@pytest.mark.parametrize(
    ("x", "y", "said"),
    [
        (
            np.zeros((2, 4), np.float32),
            np.zeros(2, np.int64),
            "own/train.npz: array x rows have shape (4,); the federation's inputs have (3,)",
        ),
        (
            np.zeros((2, 3), np.uint8),
            np.zeros(2, np.int64),
            "own/train.npz: array x is uint8; the federation's inputs are floats (scaled as "
            "the federation scales its inputs)",
        ),
        (
            np.array([[0, 0, 0], [0, np.nan, 0]], np.float32),
            np.zeros(2, np.int64),
            "own/train.npz: array x holds a NaN or infinite value (row 1)",
        ),
        (
            np.zeros((2, 3), np.float32),
            np.array([0.0, 1.0]),
            "own/train.npz: array y is float64; the federation's labels are integer class ids 0..3",
        ),
        (
            np.zeros((3, 3), np.float32),
            np.array([0, 3, 4]),
            "own/train.npz: array y holds class 4 (row 2); allowed: 0..3",
        ),
        (
            np.zeros((2, 3), np.float32),
            np.zeros((2, 5), np.int64),
            "own/train.npz: array y rows have shape (5,); the federation's labels have ()",
        ),
    ],
)
def test_examples_that_do_not_fit_the_spec_are_refused(
    x: np.ndarray, y: np.ndarray, said: str
) -> None:
    with pytest.raises(DataError) as err:
        own_data({1: _examples(x, y)}, SPEC, torch.float64, 3)
    assert str(err.value) == said


@pytest.mark.parametrize(
    ("spec", "dtype", "x", "y", "said"),
    [
        (  # finite in the file, infinite in the run's float32
            SPEC,
            torch.float32,
            np.array([[0, 0, 0], [0, 1e300, 0]]),
            np.zeros(2, np.int64),
            "own/train.npz: array x holds 1e+300, beyond the range of the run's float32 (row 1)",
        ),
        (
            DataSpec((3,), torch.float32, (), None),
            torch.float64,
            np.zeros((3, 3), np.float32),
            np.array([0.5, 1.0, np.nan]),
            "own/train.npz: array y holds a NaN or infinite value (row 2)",
        ),
        (
            DataSpec((3,), torch.float32, (1,), None),
            torch.float32,
            np.zeros((2, 3), np.float32),
            np.array([[np.inf], [0.0]]),
            "own/train.npz: array y holds a NaN or infinite value (row 0)",
        ),
        (  # 2**63 + 5 would wrap around to a negative int64
            SPEC,
            torch.float64,
            np.zeros((2, 3)),
            np.array([1, 2**63 + 5], np.uint64),
            "own/train.npz: array y holds class 9223372036854775813 (row 1); allowed: 0..3",
        ),
    ],
)
def test_values_are_checked_as_the_run_holds_them(
    spec: DataSpec, dtype: torch.dtype, x: np.ndarray, y: np.ndarray, said: str
) -> None:
    with pytest.raises(DataError) as err:
        own_data({0: _examples(x, y)}, spec, dtype, 3)
    assert str(err.value) == said


def test_a_process_holds_its_clients_rows_alone_sized_by_the_spec() -> None:
    """Clients 0 (two rows, one held out in test.npz) and 2 (labels 0..1 only) of
    3: a 4-class federation's data all the same, client 1's rows elsewhere."""
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    zero = ClientFolder(
        Examples(x[:2], np.array([3, 0]), Path("0/train.npz")),
        Examples(x[2:], np.array([2]), Path("0/test.npz")),
    )
    two = _examples(x[1:], np.array([1, 0]))
    data = own_data({0: zero, 2: two}, SPEC, torch.float64, 3)
    assert data.partition.sizes().tolist() == [2, 0, 2]
    assert data.hosted == (0, 2)
    assert data.spec() == DataSpec((3,), torch.float64, (), 4)
    for k, rows, labels in ((0, x[:2], [3, 0]), (2, x[1:], [1, 0])):
        got_x, got_y = data.client_data(k)
        assert got_x.dtype == torch.float64 and got_x.tolist() == rows.tolist()
        assert got_y.tolist() == labels
    exp = build_hosted(
        config_mod.override(config_mod.Config(), REMOTE),
        [0, 2],
        {0: zero, 2: two},
        SPEC.to_json(),
    )
    held_x, held_y = evaluation_data(exp, 0)  # its test.npz
    assert held_x.tolist() == x[2:].tolist() and held_y.tolist() == [2]
    assert evaluation_data(exp, 2)[1].tolist() == [1, 0]  # none held out: its training rows


def test_several_clients_read_a_folder_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _save(tmp_path / "site" / "0", x=np.zeros((2, 3)), y=np.zeros(2, np.int64))
    assert _client(tmp_path, "--data", str(tmp_path / "site"), "--client-id", "0-1") == 2
    assert f"{tmp_path / 'site' / '1'}: no such folder" in capsys.readouterr().err


def test_spec_travels_as_json() -> None:
    for spec in (
        SPEC,
        DataSpec((80,), torch.int64, (80,), 53),
        DataSpec((5,), torch.float64, (1,), None),
    ):
        assert DataSpec.from_json(spec.to_json()) == spec
    with pytest.raises(DataError, match="is malformed"):
        DataSpec.from_json('{"input_shape": [3], "input_dtype": "complex64"}')


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("evaluation.clients", True),
        ("diagnostics.loss_gap", True),
        ("partition.label_noise", 0.2),
        ("robust.attack", "sign_flip"),
        ("communication.group_by", "label"),
        ("partition.feature_shift", ["rotation", "invert"]),
        ("privacy.weights", "capped"),
    ],
)
def test_what_needs_the_clients_data_on_the_server_is_refused(field: str, value: object) -> None:
    changes: dict[str, object] = {**REMOTE, field: value}
    if field == "robust.attack":
        changes["robust.attack_fraction"] = 0.34
    if field == "communication.group_by":
        changes["communication.groups"] = 2
    if field == "partition.feature_shift":  # shifts images
        changes.update({"dataset": "mnist", "model": "cnn"})
    if field == "privacy.weights":  # central DP's expected weight sums every client's count
        changes.update({"privacy.dp": "central", "privacy.weight_cap": 50})
    with pytest.raises(ConfigError, match=rf"^{field} = .* deployment.client_data = 'remote'"):
        config_mod.override(config_mod.Config(), changes)
    partition = {k: v for k, v in changes.items() if k != "deployment.client_data"}
    config_mod.override(config_mod.Config(), partition)  # the simulator's partition: fine


def test_a_client_joins_as_the_server_holds_the_data() -> None:
    remote = config_mod.override(config_mod.Config(), REMOTE)
    folder = _examples(np.zeros((2, 60), np.float32), np.zeros(2, np.int64))
    with pytest.raises(ConfigError, match="join with --data PATH --client-id N"):
        build_hosted(remote, [0], None, "")
    partition = config_mod.override(remote, {"deployment.client_data": "partition"})
    with pytest.raises(ConfigError, match="join with --clients IDS, not --data"):
        build_hosted(partition, [0], folder, "")
    with pytest.raises(ConfigError, match=r"client ids \[3\] are outside .* 0..2"):
        build_hosted(remote, [3], folder, "")


def test_the_registry_median_is_of_the_clients_that_declared() -> None:
    """Clients 0 and 3 have not joined: the cap is 2 x median(10, 100, 20) = 40."""
    assert Registry([0, 10, 100, 0, 20], 2.0).limits.tolist() == [0, 10, 40, 0, 20]


def test_the_server_holds_the_test_set_and_the_joins_sizes(tmp_path: Path) -> None:
    cfg = config_mod.override(config_mod.Config(), {**REMOTE, "runs_dir": str(tmp_path)})
    full = config_mod.override(cfg, {"deployment.client_data": "partition"})
    data = load_server_data(cfg)
    loaded = build(full).data
    assert len(data.train_y) == 0 and data.hosted == ()
    assert torch.equal(data.test_x, loaded.test_x) and torch.equal(data.test_y, loaded.test_y)
    hub = Hub(cfg.num_clients, 30.0)
    hub.join("a", [(1, 17)])
    exp = dataclasses.replace(build(cfg, data), engine=RemoteEngine(hub, cfg))
    assert exp.client_sizes().tolist() == [0, 17, 0]
    hub.join("b", [(2, 5)])
    summary = partition_summary(exp)
    assert summary.sizes.tolist() == [0, 17, 5] and math.isnan(summary.heterogeneity)


def test_mnist_server_data_scales_no_training_image(mnist_dir: Path) -> None:
    cfg = config_mod.override(
        config_mod.Config(),
        {
            "data_dir": str(mnist_dir),
            "deployment.client_data": "remote",
            "robust.max_weight_ratio": 10.0,
        },
    )
    data = load_server_data(cfg)
    assert (len(data.train_y), len(data.test_y)) == (0, 10_000)
    assert data.spec() == DataSpec((1, 28, 28), torch.float32, (), 10)
