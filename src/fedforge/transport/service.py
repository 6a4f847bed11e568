"""The gRPC face of the deployment server: each call is admitted, authenticated,
parsed and bounded here, then handed to the hub (``hub.py``).

The server is ``grpc.aio``: the handlers run on one event loop, and the hub's
work (which takes its lock, or waits for work in a long-poll) on a thread pool,
only after the caller is known. Every method reads its request as a stream, so
the handler holds the call from its opening and can cancel it when the request
does not come (``admission.py``); on the wire the calls are the .proto's, unary
or not.

Nothing a client sends is trusted: a body that does not parse is refused with
INVALID_ARGUMENT, an unknown, revoked or unproven sender with UNAUTHENTICATED
or PERMISSION_DENIED, a request that does not arrive in time is cancelled, a
peer or name with too many calls open is told RESOURCE_EXHAUSTED, an upload
larger than ``deployment.max_message_mib`` or not matching its header's size and
SHA-256 is refused before the hub sees it. A refusal never changes the model,
and never stops the server.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from fedforge import __version__
from fedforge.transport.admission import Admission, address
from fedforge.transport.guard import Guard, Refused
from fedforge.transport.hub import Hub
from fedforge.transport.pb import federation_pb2 as pb

M = TypeVar("M", bound=Message)
R = TypeVar("R")
SERVICE = "fedforge.v1.Federation"


def parse(cls: type[M], data: bytes, what: str) -> M:
    """``data`` as a ``cls`` message (Refused: it does not parse)."""
    msg = cls()
    try:
        msg.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {what}: {exc}") from None
    return msg


class Call:
    """An aio call as the hub sees it (``presence.CallContext``): a callback run
    when gRPC ends the call (on the event loop's thread), and its time left."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.context = context

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self.context.add_done_callback(lambda _ended: callback())
        return True

    def time_remaining(self) -> float | None:
        return self.context.time_remaining()


class FederationService:
    """Admits, authenticates and parses each call, then asks the hub."""

    def __init__(
        self,
        hub: Hub,
        guard: Guard,
        run_name: str,
        config_yaml: str,
        max_bytes: int,
        chunk_bytes: int,
        admission: Admission,
        pool: ThreadPoolExecutor,
        data_spec_json: str = "",
    ) -> None:
        self.hub, self.guard, self.admission, self.pool = hub, guard, admission, pool
        self.data_spec_json = data_spec_json  # the clients bring their own data: its spec
        self.run_name, self.config_yaml = run_name, config_yaml
        self.max_bytes, self.chunk_bytes = max_bytes, chunk_bytes

    def handler(self) -> grpc.GenericRpcHandler:
        """The service's methods, each reading its request as a stream."""

        def call(fn: Callable[..., Any], cls: type[Message], out: type[Message]) -> Any:
            return grpc.stream_unary_rpc_method_handler(
                fn, request_deserializer=cls.FromString, response_serializer=out.SerializeToString
            )

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Hello": call(self.Hello, pb.Signed, pb.HelloReply),
                "Join": call(self.Join, pb.Signed, pb.JoinReply),
                "Poll": call(self.Poll, pb.Signed, pb.PollReply),
                "Download": grpc.stream_stream_rpc_method_handler(
                    self.Download,
                    request_deserializer=pb.Signed.FromString,
                    response_serializer=pb.Chunk.SerializeToString,
                ),
                "Upload": call(self.Upload, pb.UploadPart, pb.UploadReply),
            },
        )

    async def _hub(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` on the pool: the hub takes its lock, a poll waits."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def _call(
        self, context: grpc.aio.ServicerContext, method: str, fn: Callable[[], Any]
    ) -> Any:
        try:
            return await fn()
        except Refused as exc:
            if not exc.said:  # logged per peer address: before authentication, the
                # sender's claimed name is its own to choose
                where = address(context.peer())
                self.admission.refused(where, exc.who or where, f"{method}: {exc.reason}")
            await context.abort(exc.code, exc.reason)
        except KeyError as exc:  # an unknown session or payload: the client joins again
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))

    async def _signed(
        self, method: str, requests: AsyncIterator[pb.Signed], context: grpc.aio.ServicerContext
    ) -> tuple[str, pb.Signed]:
        """The call's request, in time, and its sender's authenticated name."""
        request = await self.admission.first(requests, context.peer(), "request")
        return self.guard.who(method, request, context), request

    async def Hello(
        self, requests: AsyncIterator[pb.Signed], context: grpc.aio.ServicerContext
    ) -> pb.HelloReply:
        async def go() -> pb.HelloReply:
            _, request = await self._signed("Hello", requests, context)
            parse(pb.HelloRequest, request.body, "HelloRequest")
            return pb.HelloReply(
                run_name=self.run_name,
                config_yaml=self.config_yaml,
                server_version=__version__,
                data_spec_json=self.data_spec_json,
            )

        return await self._call(context, "Hello", go)

    async def Join(
        self, requests: AsyncIterator[pb.Signed], context: grpc.aio.ServicerContext
    ) -> pb.JoinReply:
        async def go() -> pb.JoinReply:
            who, request = await self._signed("Join", requests, context)
            body = parse(pb.JoinRequest, request.body, "JoinRequest")
            members = [(m.client_id, m.num_examples) for m in body.members]
            evals = {m.client_id: m.num_eval_examples for m in body.members}
            try:
                with self.admission.working(who):
                    session, accepted, refused = await self._hub(self.hub.join, who, members, evals)
            except ValueError as exc:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc), who) from None
            return pb.JoinReply(
                session=session,
                accepted=accepted,
                refused=[pb.Refusal(client_id=c, reason=r) for c, r in refused],
            )

        return await self._call(context, "Join", go)

    async def Poll(
        self, requests: AsyncIterator[pb.Signed], context: grpc.aio.ServicerContext
    ) -> pb.PollReply:
        async def go() -> pb.PollReply:
            who, request = await self._signed("Poll", requests, context)
            body = parse(pb.PollRequest, request.body, "PollRequest")
            with self.admission.working(who):
                # the call itself: its closing by the client's side tells the hub
                # the process is gone (a heartbeat is held open while it works)
                work = await self._hub(
                    self.hub.poll, who, body.session, body.wait_s, body.heartbeat, Call(context)
                )
            return pb.PollReply(work=work, done=self.hub.done, reason=self.hub.done_reason)

        return await self._call(context, "Poll", go)

    async def Download(
        self, requests: AsyncIterator[pb.Signed], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Chunk]:
        async def go() -> tuple[str, bytes]:
            who, request = await self._signed("Download", requests, context)
            body = parse(pb.DownloadRequest, request.body, "DownloadRequest")
            with self.admission.working(who):
                data = await self._hub(self.hub.payload, who, body.session, body.payload_id)
            return body.payload_id, data

        payload_id, data = await self._call(context, "Download", go)
        view = memoryview(data)
        for i in range(0, len(data), self.chunk_bytes):
            yield pb.Chunk(data=bytes(view[i : i + self.chunk_bytes]))
        self.hub.delivered(payload_id, len(data))  # every chunk went: on the record

    async def Upload(
        self, parts: AsyncIterator[pb.UploadPart], context: grpc.aio.ServicerContext
    ) -> pb.UploadReply:
        async def go() -> pb.UploadReply:
            first = await self.admission.first(parts, context.peer(), "upload header")
            if first.WhichOneof("part") != "header":
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "an upload starts with its header")
            who = self.guard.who("Upload", first.header, context)
            with self.admission.working(who):
                header, data = await self._read_upload(who, first.header, parts, context)
                verdict = await self._hub(self.hub.submit, who, header, data)
            # an update's verdict may come only at its round's end: awaited on the
            # event loop, holding no thread of the pool nor a place at work
            why = await verdict.awaited(self.hub.verdict_wait_s)
            return pb.UploadReply(accepted=why is None, reason=why or "")

        return await self._call(context, "Upload", go)

    async def _read_upload(
        self,
        who: str,
        signed: pb.Signed,
        parts: AsyncIterator[pb.UploadPart],
        context: grpc.aio.ServicerContext,
    ) -> tuple[pb.UploadHeader, bytes]:
        header = parse(pb.UploadHeader, signed.body, "UploadHeader")
        if not 0 <= header.size <= self.max_bytes:
            raise Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"upload of {header.size} bytes from client {header.client_id}: at most "
                f"{self.max_bytes} are taken (deployment.max_message_mib)",
                who,
            )
        why = await self._hub(self.hub.expects, who, header)  # before a byte of the body
        if why is not None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, why, who)
        buf = bytearray()
        silence = self.admission.silence_s
        while (
            part := await self.admission.next(parts, silence, context.peer(), "upload part")
        ) is not None:
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
        digest = await self._hub(lambda: hashlib.sha256(buf).digest())
        if len(buf) != header.size or digest != header.sha256:
            raise Refused(
                grpc.StatusCode.DATA_LOSS,
                f"upload of client {header.client_id} does not match its header's size and "
                f"SHA-256 ({len(buf)} of {header.size} bytes arrived)",
                who,
            )
        return header, bytes(buf)
