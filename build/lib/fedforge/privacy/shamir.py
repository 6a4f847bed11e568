"""Shamir secret sharing (Shamir 1979, "How to share a secret") over the prime
field GF(2^521 - 1): a secret below the prime is the constant term of a random
polynomial of degree t - 1; any t of its points give it back by Lagrange
interpolation at 0, and t - 1 points are uniform whatever the secret.

Used by secure aggregation to share each client's mask seed and key; runs on
the clients (split) and the server (reconstruct); trusts nothing it is given
beyond its field arithmetic.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

PRIME = 2**521 - 1  # a Mersenne prime: 32-byte keys and seeds fit


def split(secret: int, xs: Sequence[int], t: int) -> list[tuple[int, int]]:
    """Shares (x, f(x)) of ``secret`` at the distinct non-zero ``xs`` (e.g. client
    id + 1); any ``t`` of them reconstruct it."""
    if not 0 <= secret < PRIME:
        raise ValueError("the secret must lie in [0, PRIME)")
    if not 1 <= t <= len(xs):
        raise ValueError(f"need 1 <= t <= n; got t = {t}, n = {len(xs)}")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("share points must be distinct and in (0, PRIME)")
    coeffs = [secret] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    return [(x, evaluate(coeffs, x)) for x in xs]


def evaluate(coeffs: Sequence[int], x: int) -> int:
    """The polynomial sum_i coeffs[i] x^i at ``x`` (Horner), mod PRIME."""
    y = 0
    for c in reversed(coeffs):
        y = (y * x + c) % PRIME
    return y


def reconstruct(shares: Sequence[tuple[int, int]]) -> int:
    """The constant term through ``shares`` (distinct non-zero x)."""
    xs = [x % PRIME for x, _ in shares]
    if len(set(xs)) != len(xs) or 0 in xs:
        raise ValueError("shares need distinct, non-zero x")
    secret = 0
    for i, (xi, yi) in enumerate(shares):
        num, den = 1, 1
        for j, (xj, _) in enumerate(shares):
            if i != j:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        secret = (secret + yi * num * pow(den, -1, PRIME)) % PRIME
    return secret
