"""Code generated from proto/fedforge/transport/pb/federation.proto by grpcio-tools
(`make proto`); never edited by hand (tests/test_proto.py checks it matches)."""
