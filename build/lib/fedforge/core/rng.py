"""Derived randomness (DESIGN idea 6): every draw comes from a generator seeded by
(run seed, round, client id, purpose). Nothing reads or writes global RNG state.
The one exception is opt-in: ``privacy.secret_noise`` seeds the privacy noise
from the OS (``noise_generator``)."""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
import torch


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed that depends only on ``seed`` and ``keys`` (stable across runs,
    machines and Python versions: no ``hash()``)."""
    text = "/".join([str(int(seed)), *(str(k) for k in keys)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def torch_generator(seed: int, *keys: int | str) -> torch.Generator:
    """A CPU ``torch.Generator`` for the purpose named by ``keys``."""
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, *keys))
    return gen


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    """A numpy ``Generator`` for the purpose named by ``keys``."""
    return np.random.default_rng(derive_seed(seed, *keys))


def noise_generator(secret: bool, seed: int, *keys: int | str) -> torch.Generator:
    """A privacy mechanism's generator: derived from (seed, keys) like every other
    draw (reproducible, but whoever knows the seed can draw the same noise and
    subtract it), or, ``secret``, seeded from the operating system's CSPRNG: noise
    that no seed reveals, and a run that no longer repeats bit for bit."""
    if not secret:
        return torch_generator(seed, *keys)
    gen = torch.Generator()
    gen.manual_seed(secrets.randbits(63))
    return gen
