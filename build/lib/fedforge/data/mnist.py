"""MNIST (LeCun, Cortes & Burges): IDX parsing, checked download, and a tensor cache.

Where it runs: on whichever machine loads the data (simulation host or a client).
What it trusts: nothing on disk or on the wire; every file is checked against the md5 of
its decompressed content before use. Decoded tensors are cached (keyed by those md5s)
so that a second load skips gzip and md5 work. The data folder is only ever written
when downloading into it; the cache lives elsewhere.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import math
import os
import tempfile
import time
import urllib.error
import urllib.request
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedforge.core.errors import DataError

# File name -> md5 of the DECOMPRESSED content (gzip bytes vary between copies).
MNIST_FILES: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte.gz": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte.gz": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
}
MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
MEAN = 0.1307
STD = 0.3081
NUM_CLASSES = 10
SCALINGS = ("standard", "unit", "raw")  # the input scalings of scale_pixels

_ROLES: dict[str, str] = {
    "train_x": "train-images-idx3-ubyte.gz",
    "train_y": "train-labels-idx1-ubyte.gz",
    "test_x": "t10k-images-idx3-ubyte.gz",
    "test_y": "t10k-labels-idx1-ubyte.gz",
}
_CACHE_VERSION = "v2"  # v2: the arrays carry their CRC-32
# IDX type code -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
# zlib.error: damaged deflate data inside a well-formed gzip frame
_NET_ERRORS = (OSError, ValueError, http.client.HTTPException, EOFError, zlib.error)


@dataclass(frozen=True)
class MnistData:
    """MNIST as tensors: images float32 ``[N, 1, 28, 28]`` scaled as
    :func:`scale_pixels` says (by default standardised with (x / 255 - 0.1307) /
    0.3081), labels int64 ``[N]``."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def parse_idx(raw: bytes) -> torch.Tensor:
    """Decode an (uncompressed) IDX file: magic ``00 00 <type> <ndim>``, then ``ndim``
    big-endian uint32 dimensions, then the data in row-major order."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"not an IDX file: magic bytes {raw[:4].hex()!r} must start with 0000")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        allowed = ", ".join(f"0x{c:02x}" for c in _IDX_DTYPES)
        raise DataError(f"IDX type code 0x{code:02x} is unknown; allowed: {allowed}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"IDX header needs {header} bytes for {ndim} dims, file has {len(raw)}")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[code])
    count = math.prod(dims)  # Python ints: no int64 wrap-around for absurd headers
    expected = header + count * dtype.itemsize
    if len(raw) != expected:
        raise DataError(
            f"IDX size mismatch: dims {dims} of {dtype.itemsize}-byte items need "
            f"{expected} bytes, file has {len(raw)}"
        )
    arr = np.frombuffer(raw, dtype=dtype, count=count, offset=header)
    arr = arr.astype(dtype.newbyteorder("="))  # native order, writable copy
    return torch.from_numpy(arr.reshape(dims))


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The data folder: ``data_dir`` if given, else ``$FEDFORGE_DATA``, else
    ``~/.cache/fedforge/data``. MNIST lives in ``<dir>/mnist/`` (or directly in it)."""
    if data_dir is None:
        data_dir = os.environ.get("FEDFORGE_DATA") or "~/.cache/fedforge/data"
    return Path(data_dir).expanduser()


def resolve_cache_dir(cache_dir: str | Path | None) -> Path:
    """The tensor cache folder: ``cache_dir``, else ``$FEDFORGE_CACHE``, else
    ``~/.cache/fedforge``."""
    if cache_dir is None:
        cache_dir = os.environ.get("FEDFORGE_CACHE") or "~/.cache/fedforge"
    return Path(cache_dir).expanduser()


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _gz_content_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with gzip.open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_FILE_SECONDS = 600  # a whole file from one mirror (train-images is 9.9 MB)


def _readable(path: Path) -> None:
    """The mode a plain file gets under the umask (mkstemp's is 0600: a shared data
    folder or cache would be readable by its writer only)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _fetch(name: str, md5: str, target: Path, mirrors: Sequence[str], timeout: float) -> str:
    """One pass over the mirrors; returns '' on success, else the last error text."""
    error = "no mirrors given"
    for mirror in mirrors:
        url = mirror.rstrip("/") + "/" + name
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{name}.", suffix=".part")
        tmp = Path(tmp_name)
        try:
            deadline = time.monotonic() + _FILE_SECONDS
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
                for chunk in iter(lambda: resp.read(1 << 16), b""):
                    out.write(chunk)
                    if time.monotonic() > deadline:  # a mirror that drips: try the next
                        raise TimeoutError(f"no complete file within {_FILE_SECONDS} s")
            got = _gz_content_md5(tmp)
            if got != md5:
                error = f"{url}: content md5 {got} != expected {md5}"
                continue
            _readable(tmp)
            os.replace(tmp, target)
            return ""
        except _NET_ERRORS as exc:
            error = f"{url}: {exc}"
        finally:
            tmp.unlink(missing_ok=True)
    return error


def download(
    dest_dir: str | Path,
    mirrors: Sequence[str] = MIRRORS,
    retries: int = 3,
    timeout: float = 30.0,
    backoff: float = 1.0,
) -> Path:
    """Download the MNIST files missing from ``dest_dir`` (created if needed).

    Each file goes to a temp file in ``dest_dir``, is checked against the md5 of its
    decompressed content, then atomically renamed into place. Up to ``retries`` passes
    over ``mirrors``, sleeping ``backoff * 2**k`` seconds between passes. Raises
    :class:`DataError` when a file cannot be fetched from any mirror."""
    if retries < 1:
        raise DataError(f"download retries = {retries} is invalid: must be >= 1")
    dest = Path(dest_dir)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create download folder '{dest}': {exc.strerror}") from None
    for name, md5 in MNIST_FILES.items():
        target = dest / name
        if target.is_file():
            continue
        error = ""
        for attempt in range(retries):
            if attempt:
                time.sleep(backoff * 2 ** (attempt - 1))
            try:
                error = _fetch(name, md5, target, mirrors, timeout)
            except OSError as exc:  # e.g. dest not writable
                raise DataError(f"cannot write '{target}': {exc.strerror}") from None
            if not error:
                break
        if error:
            error = " ".join(error.split())
            raise DataError(
                f"could not download {name} ({retries} tries over {len(mirrors)} mirrors); "
                f"last error: {error}"
            )
    return dest


def _locate(data_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """Where each MNIST file is: ``<data_dir>/mnist/`` first, then ``<data_dir>/``."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name in MNIST_FILES:
        for folder in (data_dir / "mnist", data_dir):
            if (folder / name).is_file():
                found[name] = folder / name
                break
        else:
            missing.append(name)
    return found, missing


def _read_checked(path: Path, expected_md5: str) -> torch.Tensor:
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"MNIST file '{path}' cannot be read or decompressed: {exc}") from None
    got = _md5(raw)
    if got != expected_md5:
        raise DataError(
            f"MNIST file '{path}' fails its checksum: content md5 {got}, expected "
            f"{expected_md5}; delete it and download again"
        )
    return parse_idx(raw)


def _check_arrays(arrays: dict[str, Any]) -> bool:
    """Decoded MNIST is consistent: uint8 images [N, 28, 28], uint8 labels [N] < 10."""
    try:
        for split in ("train", "test"):
            x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                return False
            if x.dtype != torch.uint8 or y.dtype != torch.uint8:
                return False
            if x.dim() != 3 or tuple(x.shape[1:]) != (28, 28) or y.dim() != 1:
                return False
            if x.shape[0] != y.shape[0] or (y.numel() and int(y.max()) >= NUM_CLASSES):
                return False
    except (KeyError, TypeError):
        return False
    return True


def _cache_path(cache_dir: Path) -> Path:
    text = _CACHE_VERSION + "|" + "|".join(f"{n}:{m}" for n, m in sorted(MNIST_FILES.items()))
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return cache_dir / f"mnist-{key}.pt"


def _crc(arrays: dict[str, torch.Tensor]) -> torch.Tensor:
    """The CRC-32 of each array's bytes, in ``_ROLES`` order (~25 ms for MNIST)."""
    crcs = [zlib.crc32(arrays[role].contiguous().numpy().data) for role in _ROLES]
    return torch.tensor(crcs, dtype=torch.int64)


def _load_cache(path: Path) -> dict[str, torch.Tensor] | None:
    """The cached arrays, or None (rebuild) when the file is missing, foreign or
    damaged: its arrays are not MNIST-shaped or disagree with their stored CRC-32s."""
    if not path.is_file():
        return None
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # corrupt or foreign file: ignore it and rebuild
        return None
    if not isinstance(stored, dict) or not isinstance(stored.get("crc32"), torch.Tensor):
        return None
    arrays: dict[str, torch.Tensor] = {role: stored.get(role) for role in _ROLES}  # type: ignore[misc]
    if not _check_arrays(arrays):
        return None
    if not torch.equal(stored["crc32"], _crc(arrays)):
        return None
    return arrays


def _save_cache(path: Path, arrays: dict[str, torch.Tensor]) -> None:
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(tmp_name)
        torch.save({**arrays, "crc32": _crc(arrays)}, tmp)
        _readable(tmp)
        os.replace(tmp, path)
        tmp = None
    except (OSError, RuntimeError) as exc:  # torch.save: RuntimeError on a short write
        warnings.warn(f"could not write MNIST cache '{path}': {exc}", stacklevel=3)
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _decode(data_dir: Path, allow_download: bool) -> dict[str, torch.Tensor]:
    found, missing = _locate(data_dir)
    if missing:
        looked = f"'{data_dir / 'mnist'}' and '{data_dir}'"
        fix = (
            "pass --data-dir DIR or set FEDFORGE_DATA to a folder holding the four MNIST "
            ".gz files (or a mnist/ folder with them), or go online to download them"
        )
        if not allow_download:
            raise DataError(
                f"MNIST not found (looked in {looked}; missing {', '.join(missing)}) "
                f"and download is disabled; {fix}"
            )
        try:
            download(data_dir / "mnist")
        except DataError as exc:
            reason = " ".join(str(exc).split())
            raise DataError(
                f"MNIST not found (looked in {looked}) and download failed ({reason}); {fix}"
            ) from None
        found, missing = _locate(data_dir)
    arrays = {role: _read_checked(found[name], MNIST_FILES[name]) for role, name in _ROLES.items()}
    if not _check_arrays(arrays):
        shapes = {role: tuple(t.shape) for role, t in arrays.items()}
        raise DataError(f"MNIST files in '{data_dir}' have inconsistent shapes/types: {shapes}")
    return arrays


def _check_scaling(scaling: str) -> None:
    if scaling not in SCALINGS:
        raise DataError(
            f"MNIST input scaling {scaling!r} is invalid: must be one of "
            + ", ".join(repr(s) for s in SCALINGS)
        )


def scale_pixels(images: torch.Tensor, scaling: str = "standard") -> torch.Tensor:
    """uint8 images ``[N, 28, 28]`` as float32 ``[N, 1, 28, 28]``, a new tensor
    (the cached arrays are never written): ``standard`` (x / 255 - MEAN) / STD,
    ``unit`` x / 255 in [0, 1], ``raw`` x in 0..255. Always computed in float32,
    so a float64 run casts the same values a float32 run trains on."""
    _check_scaling(scaling)
    x = images.to(torch.float32)
    if scaling == "standard":
        x.div_(255.0).sub_(MEAN).div_(STD)
    elif scaling == "unit":
        x.div_(255.0)
    return x.unsqueeze(1)


def load_mnist(
    data_dir: str | Path | None = None,
    download: bool = True,
    cache_dir: str | Path | None = None,
    scaling: str = "standard",
    train: bool = True,
) -> MnistData:
    """MNIST as float32 tensors scaled by ``scaling`` (see :func:`scale_pixels`).

    Order: the tensor cache in ``cache_dir`` (see :func:`resolve_cache_dir`), else the
    checked ``.gz`` files in ``data_dir`` (see :func:`resolve_data_dir`), downloaded
    there first when missing and ``download`` is true. Raises :class:`DataError` with a
    one-line message when the files are missing and cannot be fetched, or fail their
    checksum. The cache holds the decoded uint8 arrays, whatever the scaling.
    ``train``: False leaves the training set empty (none of its rows scaled: a
    deployment server whose clients bring their own data needs the test set alone)."""
    _check_scaling(scaling)
    cache = _cache_path(resolve_cache_dir(cache_dir))
    arrays = _load_cache(cache)
    if arrays is None:
        arrays = _decode(resolve_data_dir(data_dir), download)
        _save_cache(cache, arrays)
    rows = None if train else 0
    return MnistData(
        train_x=scale_pixels(arrays["train_x"][:rows], scaling),
        train_y=arrays["train_y"][:rows].to(torch.int64),
        test_x=scale_pixels(arrays["test_x"], scaling),
        test_y=arrays["test_y"].to(torch.int64),
    )
