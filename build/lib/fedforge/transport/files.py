"""Files of a federation's security material: names, atomic writes, reads with clear errors.

Client names become file names (``clients/<name>.pem``), certificate common names
and keys of ``keys.json``, so one rule checks them all: :func:`check_name`.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from fedforge.core.errors import ConfigError, shown

# a letter or digit first, then letters, digits, '.', '_' or '-': safe as a file name
# (no path separators, not '.' or '..', no leading '-' that reads as an option)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"


def check_name(name: object, what: str = "client name") -> str:
    """``name`` if it is a valid client name, else a :class:`ConfigError` naming it."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ConfigError(f"{what} {shown(name)} is invalid: {NAME_RULE}")
    return name


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with permissions ``mode``, all or nothing.

    The bytes go to a temporary file in the same folder (created 0600 by
    :func:`tempfile.mkstemp`, so a private key is never readable by others, not even
    while it is written), are flushed to disk, get ``mode``, and the file then takes
    the place of ``path`` with :func:`os.replace`: a reader sees the old file or the
    new one, never a part.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_bytes(path: Path, what: str, error: type[Exception] = ConfigError) -> bytes:
    """The contents of ``path``; a missing or unreadable file raises ``error`` naming
    ``what`` it should hold and the path."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} '{path}' does not exist") from None
    except OSError as exc:
        raise error(f"{what} '{path}' cannot be read: {exc.strerror or exc}") from None
