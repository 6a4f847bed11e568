"""The committed gRPC code is what the schema generates (`make proto`)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "fedforge/transport/pb/federation.proto"
GENERATED = ("federation_pb2.py", "federation_pb2.pyi", "federation_pb2_grpc.py")


def test_committed_code_matches_the_schema(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (the dev extra)")
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        str(ROOT / "proto" / SCHEMA),
    ]
    assert protoc.main(args) == 0
    for name in GENERATED:
        fresh = (tmp_path / "fedforge/transport/pb" / name).read_text()
        committed = (ROOT / "src/fedforge/transport/pb" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make proto`"


def test_the_schema_names_every_rpc_the_server_serves() -> None:
    from fedforge.transport.pb import federation_pb2 as pb
    from fedforge.transport.service import FederationService

    methods = pb.DESCRIPTOR.services_by_name["Federation"].methods_by_name
    assert set(methods) == {"Hello", "Join", "Poll", "Download", "Upload"}
    for name in methods:
        assert name in FederationService.__dict__
