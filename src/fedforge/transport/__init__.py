"""Transport: the wire format of payloads and updates (gRPC server and client come later)."""

from fedforge.transport.wire import DTYPES, MAGIC, Message, decode, encode, encoded_size

__all__ = ["DTYPES", "MAGIC", "Message", "decode", "encode", "encoded_size"]
