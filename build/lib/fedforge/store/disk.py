"""An operating system's write failure in words, for one-line messages."""

from __future__ import annotations

import errno


def os_error_text(exc: OSError) -> str:
    """Why a write failed: a full disk (or quota) says so; else the system's reason."""
    if exc.errno == errno.ENOSPC:
        return "the disk is full (no space left on device)"
    if exc.errno == errno.EDQUOT:
        return "the disk quota is exceeded"
    return exc.strerror or str(exc)
