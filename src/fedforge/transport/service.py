"""The gRPC face of the deployment server: each call is authenticated, parsed
and bounded here, then handed to the hub (``hub.py``).

Nothing a client sends is trusted: a body that does not parse is refused with
INVALID_ARGUMENT, an unknown, revoked or unproven sender with UNAUTHENTICATED
or PERMISSION_DENIED, an upload larger than ``deployment.max_message_mib`` or
not matching its header's size and SHA-256 is refused before the hub sees it.
A refusal never changes the model, and never stops the server.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from fedforge import __version__
from fedforge.transport.guard import Guard, Refused
from fedforge.transport.hub import Hub
from fedforge.transport.idle import IdleStreams
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.pb import federation_pb2_grpc as pb_grpc

M = TypeVar("M", bound=Message)


def parse(cls: type[M], data: bytes, what: str) -> M:
    """``data`` as a ``cls`` message (Refused: it does not parse)."""
    msg = cls()
    try:
        msg.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {what}: {exc}") from None
    return msg


class FederationService(pb_grpc.FederationServicer):
    """Authenticates and parses each call, then asks the hub."""

    def __init__(
        self,
        hub: Hub,
        guard: Guard,
        run_name: str,
        config_yaml: str,
        max_bytes: int,
        chunk_bytes: int,
        on_refusal: Callable[[str, int | None, str], None],
        idle: IdleStreams,
        data_spec_json: str = "",
    ) -> None:
        self.hub, self.guard, self.idle = hub, guard, idle
        self.data_spec_json = data_spec_json  # the clients bring their own data: its spec
        self.run_name, self.config_yaml = run_name, config_yaml
        self.max_bytes, self.chunk_bytes = max_bytes, chunk_bytes
        self.on_refusal = on_refusal

    def _call(self, context: grpc.ServicerContext, method: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Refused as exc:
            self.on_refusal(exc.who or "?", None, f"{method}: {exc.reason}")
            context.abort(exc.code, exc.reason)
        except KeyError as exc:  # an unknown session or payload: the client joins again
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))

    def Hello(self, request: pb.Signed, context: grpc.ServicerContext) -> pb.HelloReply:
        def go() -> pb.HelloReply:
            self.guard.who("Hello", request, context)
            parse(pb.HelloRequest, request.body, "HelloRequest")
            return pb.HelloReply(
                run_name=self.run_name,
                config_yaml=self.config_yaml,
                server_version=__version__,
                data_spec_json=self.data_spec_json,
            )

        return self._call(context, "Hello", go)

    def Join(self, request: pb.Signed, context: grpc.ServicerContext) -> pb.JoinReply:
        def go() -> pb.JoinReply:
            who = self.guard.who("Join", request, context)
            body = parse(pb.JoinRequest, request.body, "JoinRequest")
            members = [(m.client_id, m.num_examples) for m in body.members]
            evals = {m.client_id: m.num_eval_examples for m in body.members}
            try:
                session, accepted, refused = self.hub.join(who, members, evals)
            except ValueError as exc:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc), who) from None
            return pb.JoinReply(
                session=session,
                accepted=accepted,
                refused=[pb.Refusal(client_id=c, reason=r) for c, r in refused],
            )

        return self._call(context, "Join", go)

    def Poll(self, request: pb.Signed, context: grpc.ServicerContext) -> pb.PollReply:
        def go() -> pb.PollReply:
            who = self.guard.who("Poll", request, context)
            body = parse(pb.PollRequest, request.body, "PollRequest")
            # the call itself: its closing by the client's side tells the hub the
            # process is gone (a heartbeat is held open while the process works)
            work = self.hub.poll(who, body.session, body.wait_s, body.heartbeat, context)
            return pb.PollReply(work=work, done=self.hub.done, reason=self.hub.done_reason)

        return self._call(context, "Poll", go)

    def Download(self, request: pb.Signed, context: grpc.ServicerContext) -> Iterator[pb.Chunk]:
        def go() -> tuple[str, bytes]:
            who = self.guard.who("Download", request, context)
            body = parse(pb.DownloadRequest, request.body, "DownloadRequest")
            return body.payload_id, self.hub.payload(who, body.session, body.payload_id)

        payload_id, data = self._call(context, "Download", go)
        view = memoryview(data)
        for i in range(0, len(data), self.chunk_bytes):
            yield pb.Chunk(data=bytes(view[i : i + self.chunk_bytes]))
        self.hub.delivered(payload_id, len(data))  # every chunk went: on the record

    def Upload(
        self, request_iterator: Iterator[pb.UploadPart], context: grpc.ServicerContext
    ) -> pb.UploadReply:
        def go() -> pb.UploadReply:
            parts = self.idle.watch(context, request_iterator)
            try:
                who, header, data = self._read_upload(parts, context)
            except grpc.RpcError:  # cancelled by the idle watch, or by the peer
                silent = f"upload stream silent for over {self.idle.limit_s:g} s (cancelled)"
                raise Refused(grpc.StatusCode.CANCELLED, silent) from None
            why = self.hub.answer(who, header, data)
            return pb.UploadReply(accepted=why is None, reason=why or "")

        return self._call(context, "Upload", go)

    def _read_upload(
        self, parts: Iterator[pb.UploadPart], context: grpc.ServicerContext
    ) -> tuple[str, pb.UploadHeader, bytes]:
        first = next(parts, None)
        if first is None or first.WhichOneof("part") != "header":
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "an upload starts with its header")
        who = self.guard.who("Upload", first.header, context)
        header = parse(pb.UploadHeader, first.header.body, "UploadHeader")
        if not 0 <= header.size <= self.max_bytes:
            raise Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"upload of {header.size} bytes from client {header.client_id}: at most "
                f"{self.max_bytes} are taken (deployment.max_message_mib)",
                who,
            )
        why = self.hub.expects(who, header)  # before a byte of the body is read
        if why is not None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, why, who)
        buf = bytearray()
        for part in parts:
            if part.WhichOneof("part") != "data":
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "a second upload header", who)
            buf += part.data
            if len(buf) > header.size:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"upload of client {header.client_id} is longer than its declared "
                    f"{header.size} bytes",
                    who,
                )
        if len(buf) != header.size or hashlib.sha256(buf).digest() != header.sha256:
            raise Refused(
                grpc.StatusCode.DATA_LOSS,
                f"upload of client {header.client_id} does not match its header's size and "
                f"SHA-256 ({len(buf)} of {header.size} bytes arrived)",
                who,
            )
        return who, header, bytes(buf)
