"""input_scaling: MNIST's pixels under each scaling against the IDX bytes read here
(a tiny fake MNIST, and a few pixels of the real files when FEDFORGE_DATA has
them), one cache for every scaling, float64 runs cast the float32 values, the
default unchanged (MNIST and Synthetic), and the refused values and combinations."""

from __future__ import annotations

import gzip
import hashlib
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedforge.config import Config, from_dict, override
from fedforge.core.errors import ConfigError, DataError
from fedforge.core.rng import numpy_rng
from fedforge.data import mnist, synthetic
from fedforge.data.federated import load_federated_data

SCALINGS = ("standard", "unit", "raw")
N_TRAIN, N_TEST = 6, 2


def idx_images(images: np.ndarray) -> bytes:
    """An IDX file of uint8 images: 00 00 08 03, three big-endian uint32 dims, bytes."""
    return struct.pack(">BBBB3I", 0, 0, 8, 3, *images.shape) + images.tobytes()


def idx_labels(labels: np.ndarray) -> bytes:
    return struct.pack(">BBBBI", 0, 0, 8, 1, len(labels)) + labels.astype(np.uint8).tobytes()


def expected(byte: float, scaling: str) -> float:
    """What a pixel byte becomes, computed in float64 from the formulas."""
    return {"standard": (byte / 255 - 0.1307) / 0.3081, "unit": byte / 255, "raw": byte}[scaling]


@pytest.fixture
def fake_mnist(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A tiny MNIST in ``tmp_path/data`` (MNIST_FILES given its md5s), the tensor
    cache in ``tmp_path/cache``; returns the data folder and the training images."""
    rng = np.random.default_rng(5)
    train = rng.integers(0, 256, (N_TRAIN, 28, 28), dtype=np.uint8)
    train[0, 0, :3] = (0, 128, 255)
    contents = {
        "train-images-idx3-ubyte.gz": idx_images(train),
        "train-labels-idx1-ubyte.gz": idx_labels(np.arange(N_TRAIN) % 10),
        "t10k-images-idx3-ubyte.gz": idx_images(
            rng.integers(0, 256, (N_TEST, 28, 28), dtype=np.uint8)
        ),
        "t10k-labels-idx1-ubyte.gz": idx_labels(np.array([7, 1])),
    }
    folder = tmp_path / "data" / "mnist"
    folder.mkdir(parents=True)
    for name, raw in contents.items():
        monkeypatch.setitem(mnist.MNIST_FILES, name, hashlib.md5(raw).hexdigest())
        (folder / name).write_bytes(gzip.compress(raw))
    monkeypatch.setenv("FEDFORGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "data", train


def fake_config(data_dir: Path, **fields: object) -> Config:
    base = {"model": "2nn", "num_clients": 3, "data_dir": str(data_dir), "rounds": 1}
    return from_dict({**base, **fields})


def test_each_scaling_matches_the_idx_bytes(fake_mnist: tuple[Path, np.ndarray]) -> None:
    data_dir, train = fake_mnist
    for scaling in SCALINGS:
        data = load_federated_data(fake_config(data_dir, input_scaling=scaling))
        got = data.train_x[:, 0].double().numpy()
        want = np.vectorize(lambda b, s=scaling: expected(float(b), s))(train)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert data.train_x.dtype == torch.float32 and data.train_x.shape == (N_TRAIN, 1, 28, 28)
    unit = load_federated_data(fake_config(data_dir, input_scaling="unit")).train_x
    raw = load_federated_data(fake_config(data_dir, input_scaling="raw")).train_x
    assert unit[0, 0, 0, :3].tolist() == [0.0, np.float32(128) / np.float32(255), 1.0]
    assert torch.equal(raw[:, 0], torch.from_numpy(train).float())  # 0..255 exactly


def test_one_cache_for_every_scaling(fake_mnist: tuple[Path, np.ndarray]) -> None:
    """unit, then raw, then standard from the cache the first load wrote: each as
    from the files, and the cache still holds the uint8 arrays."""
    data_dir, train = fake_mnist
    first = {s: load_federated_data(fake_config(data_dir, input_scaling=s)) for s in SCALINGS}
    cache = next((data_dir.parent / "cache").glob("mnist-*.pt"))
    stored = torch.load(cache, weights_only=True)
    assert stored["train_x"].dtype == torch.uint8
    assert torch.equal(stored["train_x"], torch.from_numpy(train))
    for s in reversed(SCALINGS):
        again = load_federated_data(fake_config(data_dir, input_scaling=s))
        assert torch.equal(again.train_x, first[s].train_x)
        assert torch.equal(again.test_x, first[s].test_x)


def test_the_default_is_todays_standardisation(fake_mnist: tuple[Path, np.ndarray]) -> None:
    """Bit for bit what the loader computed before the option: float32
    x / 255 - 0.1307, / 0.3081, in that order."""
    data_dir, train = fake_mnist
    cfg = fake_config(data_dir)
    assert cfg.input_scaling == "standard" == Config().input_scaling
    before = torch.from_numpy(train).to(torch.float32).div_(255.0).sub_(0.1307).div_(0.3081)
    assert torch.equal(load_federated_data(cfg).train_x, before.unsqueeze(1))


@pytest.mark.parametrize("scaling", SCALINGS)
def test_float64_casts_the_float32_values(
    fake_mnist: tuple[Path, np.ndarray], scaling: str
) -> None:
    data_dir, _ = fake_mnist
    single = load_federated_data(fake_config(data_dir, input_scaling=scaling))
    double = load_federated_data(fake_config(data_dir, input_scaling=scaling, dtype="float64"))
    assert double.train_x.dtype == torch.float64
    assert torch.equal(double.train_x, single.train_x.double())
    assert torch.equal(double.test_x, single.test_x.double())


def test_synthetic_standard_and_raw_are_the_generated_features() -> None:
    fields = {"dataset": "synthetic", "model": "logreg", "num_clients": 5, "dtype": "float64"}
    cfg = from_dict(fields)
    assert cfg.input_scaling == "standard"
    users = synthetic.generate(1.0, 1.0, False, 5, numpy_rng(cfg.seed, "synthetic"))
    train, _ = synthetic.train_test_split(users, 0.1, numpy_rng(cfg.seed, "synthetic-split"))
    generated = torch.from_numpy(np.concatenate(train.xs))
    for scaling in ("standard", "raw"):
        data = load_federated_data(override(cfg, {"input_scaling": scaling}))
        assert torch.equal(data.train_x, generated)


def test_real_mnist_pixels(mnist_dir: Path, tmp_path: Path) -> None:
    """A few pixels of the real files, read from the IDX bytes here, under each
    scaling (one tensor cache in tmp_path for the three loads)."""
    path = mnist_dir / "mnist" / "train-images-idx3-ubyte.gz"
    if not path.is_file():
        path = mnist_dir / "train-images-idx3-ubyte.gz"
    with gzip.open(path, "rb") as fh:
        head = fh.read(16 + 10 * 784)  # the header and the first ten images
    assert struct.unpack(">4B3I", head[:16]) == (0, 0, 8, 3, 60000, 28, 28)
    spots = [(0, 5, 14), (0, 14, 14), (3, 10, 12), (7, 20, 9), (9, 0, 0)]
    pixels = [head[16 + i * 784 + r * 28 + c] for i, r, c in spots]
    assert len(set(pixels)) > 2  # dark, bright and in between
    for scaling in ("unit", "raw", "standard"):
        data = mnist.load_mnist(mnist_dir, download=False, cache_dir=tmp_path, scaling=scaling)
        for (i, r, c), byte in zip(spots, pixels, strict=True):
            got = data.train_x[i, 0, r, c].item()
            assert got == pytest.approx(expected(byte, scaling), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"input_scaling": "minmax"},
            "config field 'input_scaling' = 'minmax' is invalid: must be one of 'standard', "
            "'unit', 'raw'",
        ),
        (
            {"dataset": "synthetic", "model": "logreg", "input_scaling": "unit"},
            "config field 'input_scaling' = 'unit' is invalid: must be one of 'standard', "
            "'raw' with dataset 'synthetic'",
        ),
        (
            {"input_scaling": "raw", "partition": {"feature_shift": ["invert"]}},
            "config field 'partition.feature_shift' = ['invert'] is invalid: needs "
            "input_scaling 'standard'",
        ),
    ],
)
def test_refused_in_one_line(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)) as err:
        from_dict(fields)
    assert "\n" not in str(err.value)


def test_refused_when_built_directly() -> None:
    with pytest.raises(ConfigError, match="'input_scaling' = 'minmax' is invalid"):
        Config(input_scaling="minmax")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="'minmax' is invalid"):
        mnist.scale_pixels(torch.zeros(1, 28, 28, dtype=torch.uint8), "minmax")
