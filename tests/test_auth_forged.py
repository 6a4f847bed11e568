"""What a forged signed request costs the server (transport/auth.py): the body is
hashed once, however many served methods its refusal's reason tries."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest

from fedforge.transport.auth import AuthError, Signer
from test_transport_auth import ALICE_KEY, FETCH, T0, UPLOAD, Clock, _verifier


def test_a_forged_request_hashes_its_body_once_whatever_the_methods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reason of a refusal tries the signature over every other served method;
    the body (up to a few MiB before its sender is known) is hashed once, so a
    forged request costs the server what an honest one does, plus a check per method."""
    alice = Signer("alice", ALICE_KEY)
    methods = {UPLOAD, FETCH, "/a/B", "/c/D", "/e/F"}
    verifier = _verifier(alice, Clock(), methods=methods)
    body = b"x" * (1 << 20)
    forged = dataclasses.replace(alice.sign(UPLOAD, body, now=T0), signature=bytes(64))
    real = hashlib.sha256
    hashed: list[int] = []

    def counted(data: bytes = b"") -> Any:
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(hashlib, "sha256", counted)
    with pytest.raises(AuthError, match="bad signature from client 'alice'"):
        verifier.verify(UPLOAD, body, forged)
    assert hashed.count(len(body)) == 1
