"""A hand-made client of the deployment's identity checks, written against the
generated protobuf stubs (``fedforge.transport.pb``) and the ``cryptography``
library alone: how an outsider reading ``federation.proto`` and the signing rule
in ``fedforge.transport.auth``'s docstring would talk to a server. It signs
requests itself (so a test can keep one to replay), claims any name, and
answers work with whatever bytes a test gives it."""

from __future__ import annotations

import hashlib
import os
import re
import struct
import time
from pathlib import Path

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedforge.transport import auth
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc

DOMAIN = b"fedforge-request-v1"


def documented_method(rpc: str) -> str:
    """The method field for ``rpc`` as the docstring's item 2 spells its first
    example (``Hello`` there: a bare name; any other spelling is kept, with the
    example's RPC swapped for ``rpc``)."""
    doc = auth.__doc__ or ""
    item = re.search(r"^2\. the RPC method(.*?)^3\. ", doc, re.S | re.M)
    assert item is not None, "the docstring lists the signed fields"
    example = re.findall(r"``([^`]+)``", item.group(1))[0]
    named = re.search(r"(Hello|Join|Poll|Download|Upload)$", example)
    return example if named is None else example[: named.start()] + rpc


def signed(
    key: Ed25519PrivateKey,
    name: str,
    rpc: str,
    body: bytes,
    timestamp: float | None = None,
) -> pb.Signed:
    """``body`` signed as the docstring says: six length-prefixed fields."""
    stamp = time.time() if timestamp is None else timestamp
    nonce = os.urandom(16)
    fields = (
        DOMAIN,
        documented_method(rpc).encode(),
        name.encode(),
        nonce,
        struct.pack(">d", stamp),
        hashlib.sha256(body).digest(),
    )
    message = b"".join(struct.pack(">I", len(f)) + f for f in fields)
    proof = pb.Auth(client=name, nonce=nonce, timestamp=stamp, signature=key.sign(message))
    return pb.Signed(auth=proof, body=body)


def tls_stub(port: int, ca: Path) -> pb_grpc.FederationStub:
    """A stub over server-only TLS (keys mode), trusting the federation's CA."""
    creds = grpc.ssl_channel_credentials(ca.read_bytes())
    return pb_grpc.FederationStub(grpc.secure_channel(f"127.0.0.1:{port}", creds))


def refusal(call: object, request: object) -> grpc.RpcError:
    """The error ``call(request)`` ends in (AssertionError: it was answered)."""
    try:
        call(request, timeout=30)  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the request was answered")


def hello() -> bytes:
    return pb.HelloRequest(client_version="hand-made").SerializeToString()


def join(ids: list[int], examples: int = 10) -> bytes:
    members = [pb.Member(client_id=c, num_examples=examples) for c in ids]
    return pb.JoinRequest(members=members).SerializeToString()
