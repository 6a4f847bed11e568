"""Shakespeare by speaking role: next-character prediction, one client per role
(McMahan et al. 2017, "Communication-efficient learning of deep networks from
decentralized data", section 3; the Shakespeare set of LEAF, Caldas et al. 2018).

The text is Karpathy's tiny-shakespeare (``input.txt`` of the char-rnn repository,
1,115,394 characters), a play-script of blocks ``SPEAKER:`` + that speaker's lines, a
blank line ending each block. Each role's lines, in the order spoken, are split as in
the paper (section 3): the first 80% of the role's lines train, the last 20% (rounded
up, so at least one line) test. A role's train (or test) text is its lines, each ended by
``\n``, concatenated.

A sample is a window of the text: :data:`SEQ_LEN` = 80 input characters and, at each
step, the character that follows (text ``t``, window ``j``: input ``t[80j : 80j+80]``,
labels ``t[80j+1 : 80j+81]``). Windows tile a role's text without overlap, so every
character but the first of each role's text is a label exactly once (test accuracy is
over all test characters); a role's last window is padded, its missing labels
:data:`PAD` (no loss, not scored) and its missing inputs 0. Windows never cross roles.

Where it runs: on whichever machine loads the data. What it trusts: nothing on disk or
on the wire; the decompressed text is checked against its sha256 before use.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import tempfile
import time
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedforge.core.dataspec import PAD
from fedforge.core.errors import DataError
from fedforge.data.mnist import resolve_data_dir
from fedforge.data.partition import Partition

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"  # decompressed
FILE_NAMES = ("tinyshakespeare.txt.gz", "tinyshakespeare.txt")  # gzip or plain, either name
SEQ_LEN = 80  # characters of a window: a model reads them, predicting each next one
_MAX_BYTES = 16 << 20  # a download longer than this is not the 1.1 MB text
_FILE_SECONDS = 300
_NET_ERRORS = (OSError, ValueError, http.client.HTTPException, EOFError, zlib.error)


@dataclass(frozen=True, eq=False)
class ShakespeareData:
    """The windows of each role. ``vocab[i]`` is the character of index ``i``: the
    sorted characters of the whole text (tiny-shakespeare: 65; 0 ``\n``, 1 space,
    2-12 ``!$&',-.3:;?``, 13-38 ``A``-``Z``, 39-64 ``a``-``z``). ``*_x``: the windows'
    input characters, int64 ``[N, 80]``; ``*_y``: their labels, int64 ``[N, 80]``
    (:data:`PAD` past a role's end). ``partition`` (train rows) and
    ``test_partition`` (test rows) have one client per role, in ``roles`` order
    (order of first speech); a role's rows are contiguous."""

    vocab: str
    roles: tuple[str, ...]
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    partition: Partition
    test_partition: Partition


def parse_play(text: str) -> dict[str, list[str]]:
    """Each role's lines in the order spoken, roles in order of first speech. A block
    is a ``SPEAKER:`` line then that speaker's lines; a blank line (or one of spaces
    only, or the end) ends it, and a speaker with no lines (a stage cue) is still a
    role. A block that does not open with a line ending in ``:`` is a DataError
    naming its line number."""
    roles: dict[str, list[str]] = {}
    speaker: str | None = None  # None: between blocks
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            speaker = None
        elif speaker is None:
            name = line.strip()
            if not name.endswith(":") or len(name) == 1:
                shown = line if len(line) <= 60 else line[:57] + "..."
                raise DataError(
                    f"Shakespeare text line {number} opens a block but is not a "
                    f"'SPEAKER:' line: {shown!r}"
                )
            speaker = name[:-1].strip()
            roles.setdefault(speaker, [])
        else:
            roles[speaker].append(line)
    return roles


def split_lines(lines: list[str]) -> tuple[str, str]:
    """A role's (train, test) text: test the last ceil(20%) of its lines (at least
    one line of a role that speaks), train the rest; each line ended by ``\\n``."""
    cut = len(lines) - (len(lines) + 4) // 5  # (n + 4) // 5 = ceil(n / 5) test lines
    train = "".join(line + "\n" for line in lines[:cut])
    test = "".join(line + "\n" for line in lines[cut:])
    return train, test


def _encode(text: str, vocab: str) -> np.ndarray:
    """``text`` as indices into ``vocab`` (sorted; holds every char of ``text``)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = np.frombuffer(vocab.encode("utf-32-le"), dtype=np.uint32)
    return np.searchsorted(table, codes).astype(np.int64)


def role_windows(chars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (inputs, labels) windows ``[W, 80]`` tiling one role's encoded text: W =
    ceil((n - 1) / 80) for ``n`` characters (none below two)."""
    count = max(0, -(-(len(chars) - 1) // SEQ_LEN))
    padded = np.full(count * SEQ_LEN + 1, PAD, dtype=np.int64)
    padded[: len(chars)] = chars
    x = padded[:-1].reshape(count, SEQ_LEN).copy()
    x[x == PAD] = 0  # inputs past the end: any character (their labels weigh nothing)
    return x, padded[1:].reshape(count, SEQ_LEN).copy()


def _samples(texts: list[str], vocab: str) -> tuple[torch.Tensor, torch.Tensor, Partition]:
    """(inputs, labels, one client a role) of one split: each role's windows in turn."""
    pairs = [role_windows(_encode(t, vocab)) for t in texts]
    sizes = np.array([len(x) for x, _ in pairs], dtype=np.int64)
    ends = np.cumsum(sizes)
    x = np.concatenate([x for x, _ in pairs]) if pairs else np.zeros((0, SEQ_LEN), np.int64)
    y = np.concatenate([y for _, y in pairs]) if pairs else np.zeros((0, SEQ_LEN), np.int64)
    part = Partition(tuple(np.arange(e - n, e) for n, e in zip(sizes, ends, strict=True)))
    return torch.from_numpy(x), torch.from_numpy(y), part


def build_shakespeare(text: str) -> ShakespeareData:
    """The samples of a play-script ``text`` (see the module docstring)."""
    vocab = "".join(sorted(set(text)))
    if len(vocab) > 256:
        raise DataError(f"Shakespeare text has {len(vocab)} distinct characters; at most 256")
    roles = parse_play(text)
    if not roles:
        raise DataError("Shakespeare text holds no 'SPEAKER:' block")
    splits = [split_lines(lines) for lines in roles.values()]
    train_x, train_y, part = _samples([s[0] for s in splits], vocab)
    test_x, test_y, test_part = _samples([s[1] for s in splits], vocab)
    return ShakespeareData(vocab, tuple(roles), train_x, train_y, test_x, test_y, part, test_part)


def _decompress(raw: bytes, where: str) -> bytes:
    """``raw`` itself, or its gunzipped content when it starts with the gzip magic."""
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"Shakespeare file '{where}' cannot be decompressed: {exc}") from None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download_shakespeare(
    dest_dir: str | Path,
    url: str | None = None,
    retries: int = 3,
    timeout: float = 30.0,
    backoff: float = 1.0,
) -> Path:
    """Fetch the text (gzip or plain) from ``url`` (default :data:`URL`) into
    ``dest_dir/tinyshakespeare.txt`` unless a file of :data:`FILE_NAMES` is there
    (plain, whatever was served). The content is checked against
    :data:`SHA256` before it is atomically renamed into place; up to ``retries``
    tries, sleeping ``backoff * 2**k`` s between them. Raises :class:`DataError`."""
    if retries < 1:
        raise DataError(f"download retries = {retries} is invalid: must be >= 1")
    url = url or URL
    dest = Path(dest_dir)
    for name in FILE_NAMES:
        if (dest / name).is_file():
            return dest / name
    target = dest / FILE_NAMES[1]
    error = ""
    for attempt in range(retries):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            deadline, chunks, size = time.monotonic() + _FILE_SECONDS, [], 0
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                for chunk in iter(lambda: resp.read(1 << 16), b""):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > _MAX_BYTES or time.monotonic() > deadline:
                        raise ValueError(f"more than {_MAX_BYTES} bytes or {_FILE_SECONDS} s")
            text = _decompress(b"".join(chunks), url)
        except (DataError, *_NET_ERRORS) as exc:
            error = " ".join(f"{url}: {exc}".split())
            continue
        got = _sha256(text)
        if got != SHA256:
            error = f"{url}: content sha256 {got} != expected {SHA256}"
            continue
        try:
            dest.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{target.name}.", suffix=".part")
            with os.fdopen(fd, "wb") as out:
                out.write(text)
            umask = os.umask(0)  # mkstemp's mode is 0600: give it the umask's
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, target)
        except OSError as exc:
            raise DataError(f"cannot write '{target}': {exc.strerror}") from None
        return target
    raise DataError(
        f"could not download the Shakespeare text ({retries} tries); last error: {error}"
    )


def _locate(data_dir: Path) -> Path | None:
    """The text's file: ``<data_dir>/shakespeare/`` first, then ``<data_dir>/``."""
    for folder in (data_dir / "shakespeare", data_dir):
        for name in FILE_NAMES:
            if (folder / name).is_file():
                return folder / name
    return None


def read_text(path: Path, expected_sha256: str | None = None) -> str:
    """The checked text of ``path`` (gzip or plain): a DataError when it cannot be
    read, or when the sha256 of its decompressed content is not ``expected_sha256``
    (default: :data:`SHA256`)."""
    expected_sha256 = expected_sha256 or SHA256
    try:
        raw = _decompress(path.read_bytes(), str(path))
    except OSError as exc:
        raise DataError(f"Shakespeare file '{path}' cannot be read: {exc.strerror}") from None
    got = _sha256(raw)
    if got != expected_sha256:
        raise DataError(
            f"Shakespeare file '{path}' fails its checksum: content sha256 {got}, expected "
            f"{expected_sha256}; delete it and download again"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"Shakespeare file '{path}' is not UTF-8 text: {exc}") from None


def load_shakespeare(data_dir: str | Path | None = None, download: bool = True) -> ShakespeareData:
    """The Shakespeare samples (see :class:`ShakespeareData`) from the checked text in
    ``data_dir`` (see :func:`fedforge.data.resolve_data_dir`; in its ``shakespeare/``
    folder or directly in it), downloaded into ``shakespeare/`` first when missing and
    ``download`` is true. Raises :class:`DataError` with a one-line message."""
    root = resolve_data_dir(data_dir)
    path = _locate(root)
    if path is None:
        looked = f"'{root / 'shakespeare'}' and '{root}' for {' or '.join(FILE_NAMES)}"
        fix = (
            "pass --data-dir DIR or set FEDFORGE_DATA to a folder holding a shakespeare/ "
            "folder with the text, or go online to download it"
        )
        if not download:
            raise DataError(
                f"Shakespeare not found (looked in {looked}) and download is disabled; {fix}"
            )
        try:
            path = download_shakespeare(root / "shakespeare")
        except DataError as exc:
            raise DataError(
                f"Shakespeare not found (looked in {looked}) and {exc}; {fix}"
            ) from None
    return build_shakespeare(read_text(path))


@dataclass(frozen=True)
class ShakespeareSummary:
    """Sizes of a :class:`ShakespeareData`: windows and scored characters of each
    split; min/median/max of the roles' train windows (roles of under two train
    characters count as 0)."""

    roles: int
    vocab: int
    train_windows: int
    test_windows: int
    train_chars: int
    test_chars: int
    roles_without_train: int
    min_train: int
    median_train: float
    max_train: int

    def format(self) -> str:
        return (
            f"{self.roles} roles, vocabulary {self.vocab}; {self.train_windows} train and "
            f"{self.test_windows} test windows of {SEQ_LEN} ({self.train_chars} and "
            f"{self.test_chars} characters to predict); train windows per role min "
            f"{self.min_train} / median {self.median_train:g} / max {self.max_train}; "
            f"{self.roles_without_train} roles have no train window"
        )


def summarize_shakespeare(data: ShakespeareData) -> ShakespeareSummary:
    sizes = data.partition.sizes()
    return ShakespeareSummary(
        roles=len(data.roles),
        vocab=len(data.vocab),
        train_windows=len(data.train_y),
        test_windows=len(data.test_y),
        train_chars=int((data.train_y != PAD).sum()),
        test_chars=int((data.test_y != PAD).sum()),
        roles_without_train=int((sizes == 0).sum()),
        min_train=int(sizes.min()) if sizes.size else 0,
        median_train=float(np.median(sizes)) if sizes.size else 0.0,
        max_train=int(sizes.max()) if sizes.size else 0,
    )
