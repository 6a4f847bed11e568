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
peer or name with too many calls open is told RESOURCE_EXHAUSTED (an upload
past its name's bytes at once waits for room first), an upload
larger than ``deployment.max_message_mib`` or not matching its header's size and
SHA-256 is refused before the hub sees it. A refusal never changes the model,
and never stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from fedforge import __version__
from fedforge.transport.admission import Admission, address
from fedforge.transport.guard import Guard, Refused
from fedforge.transport.hub import Hub
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.plugins import join_refusal
from fedforge.transport.waits import Waits
from fedforge.transport.work import Superseded, Verdict

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
    """An aio call as the hub sees it (``presence.CallContext``): callbacks run
    when gRPC ends the call, each through ``run`` (the hub's pool), and its time
    left. gRPC's own done callback is registered at once, on the loop, while the
    call is open: one added later than the call's end would never run, so
    ``add_callback`` says False then (the caller acts on the end itself)."""

    def __init__(
        self,
        context: grpc.aio.ServicerContext,
        run: Callable[[Callable[[], None]], None] = lambda fn: fn(),
    ) -> None:
        self.context, self.run = context, run
        self.ended = False
        self.sent = False  # whether it ended with its reply sent
        self._lock = threading.Lock()  # callbacks are added from the pool's threads
        self._callbacks: list[Callable[[], None]] = []
        context.add_done_callback(self._end)

    def _end(self, context: grpc.aio.ServicerContext) -> None:
        with self._lock:
            self.ended = True
            self.sent = context.done()  # its status went out (not: cancelled, cut)
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            self.run(callback)

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if self.ended:
                return False
            self._callbacks.append(callback)
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
        *,
        max_waiting: int,
        plugins: Sequence[pb.Plugin] = (),
    ) -> None:
        self.hub, self.guard, self.admission, self.pool = hub, guard, admission, pool
        self.waits = Waits(max_waiting, lambda who, why: admission.refuse("waiting", who, why))
        hub.on_wake = self.waits.ring
        self.data_spec_json = data_spec_json  # the clients bring their own data: its spec
        self.run_name, self.config_yaml = run_name, config_yaml
        self.plugins = list(plugins)  # the run's: a joining process must hold each
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
        """``fn(*args)`` on the pool: a short step that takes the hub's lock."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _aside(self, fn: Callable[[], None]) -> None:
        """``fn()`` on the pool, not awaited (a call's end: the loop never blocks
        on the hub's lock); at once when the pool is shut (the server stops)."""
        try:
            self.pool.submit(fn)
        except RuntimeError:
            fn()

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
                plugins=self.plugins,
            )

        return await self._call(context, "Hello", go)

    async def Join(
        self, requests: AsyncIterator[pb.Signed], context: grpc.aio.ServicerContext
    ) -> pb.JoinReply:
        async def go() -> pb.JoinReply:
            who, request = await self._signed("Join", requests, context)
            body = parse(pb.JoinRequest, request.body, "JoinRequest")
            why = join_refusal(self.plugins, body.plugins)
            if why is not None:  # never a member: the run goes on without it
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, why, who)
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
        call = Call(context, self._aside)  # at once: its end is heard from its start

        async def go() -> pb.PollReply:
            who, request = await self._signed("Poll", requests, context)
            body = parse(pb.PollRequest, request.body, "PollRequest")
            with self.admission.working(who), self.waits.held(who):
                work = await self._poll(who, body, call)
            if self.hub.halted and not work:  # the server stops: come back (to a resumed one)
                raise Refused(grpc.StatusCode.UNAVAILABLE, self.hub.halted, who, said=True)
            return pb.PollReply(work=work, done=self.hub.done, reason=self.hub.done_reason)

        return await self._call(context, "Poll", go)

    async def _poll(self, who: str, body: pb.PollRequest, call: Call) -> list[pb.Work]:
        """The poll's work, its waits on the loop (``waits.py``). The call itself
        tells the hub when the client's side closed it (a heartbeat is held open
        while the process works); work handed to a call that ended before its
        reply went out is put back (``polls.py``)."""
        hub = self.hub
        p = await self._hub(hub.open_poll, who, body.session, body.wait_s, body.heartbeat, call)
        # a reply given but never sent (the call was cut after its handler returned)
        call.add_callback(lambda: None if call.sent else hub.unsent(p))
        delivered = False
        try:
            while True:
                bell = self.waits.bell()
                work = await self._hub(hub.step_poll, p)
                if work is not None:
                    delivered = True
                    return work
                await self.waits.until(bell, p.end - hub.clock())
        finally:
            try:  # shielded: a cancelled handler still ends its poll at the hub
                end = asyncio.get_running_loop().run_in_executor(
                    self.pool, hub.end_poll, p, delivered
                )
            except RuntimeError:  # the pool is shut: the server stops
                hub.end_poll(p, delivered)
            else:
                await asyncio.shield(end)

    async def Download(
        self, requests: AsyncIterator[pb.Signed], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Chunk]:
        # a place at work is held until the last chunk went: a stream its client
        # does not read holds a chunk and the payload (maybe one the hub has
        # replaced since), so a name's streams are bounded like its other calls
        with contextlib.ExitStack() as held:

            async def go() -> tuple[str, bytes]:
                who, request = await self._signed("Download", requests, context)
                body = parse(pb.DownloadRequest, request.body, "DownloadRequest")
                held.enter_context(self.admission.working(who))
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
                verdict = await self._take_upload(who, first.header, parts, context)
            # an update's verdict may come only at its round's end: awaited on the
            # event loop, holding no thread of the pool, nor a place at work, nor
            # the upload's bytes (the hub's now; a repeat's, dropped), by one call
            # of each upload (a repeat's takes the place of the one before)
            try:
                why = await verdict.awaited(self.hub.verdict_wait_s)
            except Superseded as exc:
                raise Refused(grpc.StatusCode.ABORTED, str(exc), who, said=True) from None
            return pb.UploadReply(accepted=why is None, reason=why or "")

        return await self._call(context, "Upload", go)

    async def _take_upload(
        self,
        who: str,
        signed: pb.Signed,
        parts: AsyncIterator[pb.UploadPart],
        context: grpc.aio.ServicerContext,
    ) -> Verdict:
        """The upload read and handed to the hub: the verdict its sender waits for."""
        header, data = await self._read_upload(who, signed, parts, context)
        return await self._hub(self.hub.submit, who, header, data)

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
        # past the name's bytes at once, it waits for room as long as a verdict may,
        # and is then asked about again: the round may have moved on meanwhile
        async with self.admission.reading_upload(
            who, header.size, self.hub.verdict_wait_s
        ) as waited:
            if waited and (why := await self._hub(self.hub.expects, who, header)) is not None:
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
