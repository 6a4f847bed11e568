"""Derived randomness (DESIGN idea 6): every draw comes from a generator seeded by
(run seed, round, client id, purpose). Nothing reads or writes global RNG state."""

from __future__ import annotations

import hashlib

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
