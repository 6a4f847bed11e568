"""MNIST loading: IDX parsing on hand-built bytes, checksums, offline errors, the cache,
and the real data set's published label counts (when FEDFORGE_DATA points at it)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import struct
import time
import urllib.error
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from fedforge.core.errors import DataError
from fedforge.data import mnist


def idx_bytes(arr: np.ndarray, code: int, be_dtype: str) -> bytes:
    """IDX by hand: 00 00 code ndim, big-endian uint32 dims, big-endian data."""
    head = struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return head + arr.astype(be_dtype).tobytes()


def test_parse_idx_uint8_images() -> None:
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = bytes([0, 0, 8, 3]) + bytes([0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4]) + arr.tobytes()
    out = mnist.parse_idx(raw)
    assert out.dtype == torch.uint8 and tuple(out.shape) == (2, 3, 4)
    assert out[1, 2, 3].item() == 23


def test_parse_idx_big_endian_types() -> None:
    ints = np.array([1, -2, 70000], dtype=np.int64)
    out = mnist.parse_idx(idx_bytes(ints, 0x0C, ">i4"))
    assert out.dtype == torch.int32 and out.tolist() == [1, -2, 70000]
    # 258 as a big-endian int32 is 00 00 01 02
    assert idx_bytes(np.array([258]), 0x0C, ">i4")[-4:] == b"\x00\x00\x01\x02"
    floats = np.array([[0.5, -1.25]], dtype=np.float64)
    out = mnist.parse_idx(idx_bytes(floats, 0x0E, ">f8"))
    assert out.dtype == torch.float64 and out.tolist() == [[0.5, -1.25]]


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"\x01\x00\x08\x01\x00\x00\x00\x01\x05", "magic"),
        (b"\x00\x00\x07\x01\x00\x00\x00\x01\x05", "type code"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x03\x05\x06", "size mismatch"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x01\x05\x06", "size mismatch"),
        (b"\x00\x00\x08\x02\x00\x00", "header"),
        # dims 65536^4: the int64 element count wrapped to 0 and reshape raised ValueError
        (b"\x00\x00\x08\x04" + b"\x00\x01\x00\x00" * 4, "size mismatch"),
    ],
)
def test_parse_idx_rejects_bad_bytes(raw: bytes, words: str) -> None:
    with pytest.raises(DataError, match=words):
        mnist.parse_idx(raw)


# ----------------------------------------------------------------------------- fake data

N_TRAIN, N_TEST = 5, 3


def fake_contents() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    train_x = rng.integers(0, 256, (N_TRAIN, 28, 28), dtype=np.uint8)
    train_x[0, 0, 0], train_x[0, 0, 1] = 255, 0
    return {
        "train-images-idx3-ubyte.gz": idx_bytes(train_x, 8, "u1"),
        "train-labels-idx1-ubyte.gz": idx_bytes(np.array([3, 1, 4, 1, 5]), 8, "u1"),
        "t10k-images-idx3-ubyte.gz": idx_bytes(
            rng.integers(0, 256, (N_TEST, 28, 28), dtype=np.uint8), 8, "u1"
        ),
        "t10k-labels-idx1-ubyte.gz": idx_bytes(np.array([9, 2, 6]), 8, "u1"),
    }


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, bytes]:
    """MNIST_FILES pointed at tiny fake files (md5 of their content); no sleeping."""
    contents = fake_contents()
    for name, raw in contents.items():
        monkeypatch.setitem(mnist.MNIST_FILES, name, hashlib.md5(raw).hexdigest())
    monkeypatch.setattr(mnist.time, "sleep", lambda s: None)
    return contents


def write_gz(folder: Path, contents: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, raw in contents.items():
        (folder / name).write_bytes(gzip.compress(raw))
    return folder


def test_load_fake_values(fake: dict[str, bytes], tmp_path: Path) -> None:
    write_gz(tmp_path / "data" / "mnist", fake)
    data = mnist.load_mnist(tmp_path / "data", download=False, cache_dir=tmp_path / "c")
    assert tuple(data.train_x.shape) == (N_TRAIN, 1, 28, 28) and data.train_x.dtype == torch.float32
    assert tuple(data.test_x.shape) == (N_TEST, 1, 28, 28)
    assert data.train_y.dtype == torch.int64 and data.train_y.tolist() == [3, 1, 4, 1, 5]
    assert data.test_y.tolist() == [9, 2, 6]
    assert data.train_x[0, 0, 0, 0].item() == pytest.approx((1.0 - 0.1307) / 0.3081, abs=1e-6)
    assert data.train_x[0, 0, 0, 1].item() == pytest.approx(-0.1307 / 0.3081, abs=1e-6)


def test_files_directly_in_data_dir(fake: dict[str, bytes], tmp_path: Path) -> None:
    write_gz(tmp_path / "flat", fake)
    data = mnist.load_mnist(tmp_path / "flat", download=False, cache_dir=tmp_path / "c")
    assert data.test_y.tolist() == [9, 2, 6]


def test_checksum_mismatch_names_file_and_both_md5s(fake: dict[str, bytes], tmp_path: Path) -> None:
    folder = write_gz(tmp_path / "data" / "mnist", fake)
    name = "train-labels-idx1-ubyte.gz"
    tampered = fake[name][:-1] + b"\x07"
    (folder / name).write_bytes(gzip.compress(tampered))
    with pytest.raises(DataError) as info:
        mnist.load_mnist(tmp_path / "data", download=False, cache_dir=tmp_path / "c")
    msg = str(info.value)
    assert name in msg
    assert hashlib.md5(tampered).hexdigest() in msg
    assert hashlib.md5(fake[name]).hexdigest() in msg


def test_missing_without_download_is_one_line(fake: dict[str, bytes], tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        mnist.load_mnist(tmp_path / "nothing", download=False, cache_dir=tmp_path / "c")
    msg = str(info.value)
    assert "\n" not in msg
    assert str(tmp_path / "nothing") in msg and "FEDFORGE_DATA" in msg and "--data-dir" in msg


def test_offline_download_fails_with_one_line(
    fake: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def offline(url: str, timeout: float) -> io.BytesIO:
        calls.append(url)
        raise urllib.error.URLError("[Errno -3] Temporary failure\nin name resolution")

    monkeypatch.setattr(mnist.urllib.request, "urlopen", offline)
    with pytest.raises(DataError) as info:
        mnist.load_mnist(tmp_path / "data", download=True, cache_dir=tmp_path / "c")
    msg = str(info.value)
    assert "\n" not in msg and "FEDFORGE_DATA" in msg and "go online" in msg
    assert len(calls) == 3 * len(mnist.MIRRORS)  # 3 passes over every mirror, then give up
    assert not [p for p in (tmp_path / "data" / "mnist").iterdir()]  # no partial files


def test_download_verifies_content_and_falls_back(
    fake: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirrors = ("http://bad.example/", "http://good.example/")

    def serve(url: str, timeout: float) -> io.BytesIO:
        name = url.rsplit("/", 1)[1]
        body = fake[name] + (b"x" if url.startswith("http://bad") else b"")
        return io.BytesIO(gzip.compress(body))

    monkeypatch.setattr(mnist.urllib.request, "urlopen", serve)
    dest = mnist.download(tmp_path / "dl", mirrors=mirrors, retries=1)
    assert sorted(os.listdir(dest)) == sorted(fake)
    umask = os.umask(0)
    os.umask(umask)
    for name in fake:  # readable by others under the umask (mkstemp's 0600 was kept)
        assert (dest / name).stat().st_mode & 0o777 == 0o666 & ~umask
    for name, raw in fake.items():
        assert gzip.decompress((dest / name).read_bytes()) == raw
    # Only a bad mirror: every try fails the checksum.
    with pytest.raises(DataError, match="md5"):
        mnist.download(tmp_path / "dl2", mirrors=mirrors[:1], retries=2)


def test_cache_round_trip_and_read_only_data_dir(
    fake: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    write_gz(data_dir / "mnist", fake)
    before = sorted(str(p) for p in data_dir.rglob("*"))
    first = mnist.load_mnist(data_dir, download=False, cache_dir=tmp_path / "c")
    assert sorted(str(p) for p in data_dir.rglob("*")) == before  # nothing written there
    cached = list((tmp_path / "c").iterdir())
    assert len(cached) == 1 and cached[0].suffix == ".pt"

    def no_gzip(data: bytes) -> bytes:
        raise AssertionError("a cached load must not decompress")

    monkeypatch.setattr(mnist.gzip, "decompress", no_gzip)
    second = mnist.load_mnist(tmp_path / "gone", download=False, cache_dir=tmp_path / "c")
    for a, b in zip(
        (first.train_x, first.train_y, first.test_x, first.test_y),
        (second.train_x, second.train_y, second.test_x, second.test_y),
        strict=True,
    ):
        assert torch.equal(a, b)
    monkeypatch.undo()

    # A corrupt cache is ignored and rebuilt.
    for name, raw in fake.items():
        monkeypatch.setitem(mnist.MNIST_FILES, name, hashlib.md5(raw).hexdigest())
    cached[0].write_bytes(b"not a torch file")
    third = mnist.load_mnist(data_dir, download=False, cache_dir=tmp_path / "c")
    assert torch.equal(third.train_x, first.train_x)
    assert mnist._load_cache(cached[0]) is not None

    # So is a readable cache whose bytes changed (a flipped pixel: its CRC-32 fails).
    stored = torch.load(cached[0], weights_only=True)
    stored["train_x"][0, 0, 0] ^= 1
    torch.save(stored, cached[0])
    assert mnist._load_cache(cached[0]) is None
    fourth = mnist.load_mnist(data_dir, download=False, cache_dir=tmp_path / "c")
    assert torch.equal(fourth.train_x, first.train_x)
    assert mnist._load_cache(cached[0]) is not None  # rebuilt


def test_damaged_deflate_data_is_a_data_error(fake: dict[str, bytes], tmp_path: Path) -> None:
    """A gzip frame whose compressed bytes are damaged raises zlib.error, not
    OSError: it is a one-line DataError naming the file, and a mirror serving it
    is skipped for the next."""
    folder = write_gz(tmp_path / "data" / "mnist", fake)
    path = folder / "train-labels-idx1-ubyte.gz"
    labels = np.random.default_rng(0).integers(0, 10, 5000, dtype=np.uint8)
    raw = bytearray(gzip.compress(idx_bytes(labels, 8, "u1")))
    for i in range(40, 48):  # inside the deflate stream: "invalid distance too far back"
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(zlib.error):  # what gzip raises for it
        gzip.decompress(bytes(raw))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz.*cannot be read or decomp"):
        mnist.load_mnist(tmp_path / "data", download=False, cache_dir=tmp_path / "c")
    good = write_gz(tmp_path / "good", fake)
    mnist.download(tmp_path / "got", mirrors=[folder.as_uri() + "/", good.as_uri() + "/"])
    assert (tmp_path / "got" / path.name).read_bytes() == (good / path.name).read_bytes()


def test_resolve_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDFORGE_DATA", raising=False)
    monkeypatch.delenv("FEDFORGE_CACHE", raising=False)
    assert mnist.resolve_data_dir(None) == Path.home() / ".cache" / "fedforge" / "data"
    assert mnist.resolve_cache_dir(None) == Path.home() / ".cache" / "fedforge"
    monkeypatch.setenv("FEDFORGE_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("FEDFORGE_CACHE", str(tmp_path / "cache"))
    assert mnist.resolve_data_dir(None) == tmp_path / "env"
    assert mnist.resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert mnist.resolve_cache_dir(None) == tmp_path / "cache"


# ----------------------------------------------------------------------------- real MNIST


def _real_dir() -> Path | None:
    env = os.environ.get("FEDFORGE_DATA")
    if not env:
        return None
    root = Path(env)
    for folder in (root / "mnist", root):
        if all((folder / n).is_file() for n in mnist.MNIST_FILES):
            return root
    return None


@pytest.mark.skipif(_real_dir() is None, reason="FEDFORGE_DATA does not point at MNIST")
def test_real_mnist(tmp_path: Path) -> None:
    data = mnist.load_mnist(_real_dir(), download=False, cache_dir=tmp_path)
    assert tuple(data.train_x.shape) == (60000, 1, 28, 28)
    assert tuple(data.test_x.shape) == (10000, 1, 28, 28)
    assert tuple(data.train_y.shape) == (60000,) and tuple(data.test_y.shape) == (10000,)
    assert int((data.train_y == 1).sum()) == 6742
    assert int((data.test_y == 0).sum()) == 980
    assert abs(float(data.train_x.mean())) < 0.01 and abs(float(data.train_x.std()) - 1) < 0.01
    start = time.perf_counter()
    again = mnist.load_mnist(_real_dir(), download=False, cache_dir=tmp_path)
    elapsed = time.perf_counter() - start
    assert torch.equal(again.test_x, data.test_x)
    assert elapsed < 1.5, f"cached load took {elapsed:.2f} s (target < 0.5 s)"


def test_a_mirror_that_drips_is_left_for_the_next(
    fake: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read within the socket timeout, the file never complete: the next
    mirror is tried once the whole-file deadline passes (it took hours)."""
    clock = [0.0]
    monkeypatch.setattr(mnist.time, "monotonic", lambda: clock[0])

    class Drip(io.BytesIO):
        def read(self, size: int = -1) -> bytes:
            clock[0] += 60.0  # a minute a chunk
            if clock[0] > 100 * 3600:  # not left after 100 hours: fail, do not hang
                raise AssertionError("the download never gave the mirror up")
            return b"\x1f"

    def serve(url: str, timeout: float) -> io.BytesIO:
        if url.startswith("http://slow"):
            return Drip()
        return io.BytesIO(gzip.compress(fake[url.rsplit("/", 1)[1]]))

    monkeypatch.setattr(mnist.urllib.request, "urlopen", serve)
    dest = mnist.download(tmp_path / "dl", mirrors=("http://slow.example/", "http://ok.example/"))
    assert sorted(os.listdir(dest)) == sorted(fake)
