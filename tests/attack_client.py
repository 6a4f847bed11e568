"""A hostile peer of a fedforge server, written against the wire alone: the
messages and service generated from ``federation.proto`` (``fedforge.transport.pb``)
and grpc, none of fedforge's client code. Run as a process of its own:

    python tests/attack_client.py idle --target HOST:PORT --calls 250 --hold-s 20
    python tests/attack_client.py oversize --target HOST:PORT --calls 8 --mib 120
    python tests/attack_client.py hello --target HOST:PORT --cert c.pem --key c.key
    python tests/attack_client.py forged --target HOST:PORT --calls 2000 --name alice
    python tests/attack_client.py polls --target HOST:PORT --names 20 --calls 16 --hold-s 20

``idle`` keeps ``--calls`` calls open that never send their request (a call whose
request stream never yields is, on the wire, a unary call whose message never
comes), opening a new one whenever the server ends one, for ``--hold-s``
seconds (or until SIGTERM), and counts how the server ended them; ``oversize``
sends Hellos of ``--mib`` MiB at once; ``hello`` makes one call with a
certificate; ``forged`` sends ``--calls`` Hellos claiming
``--name`` with a fresh nonce and timestamp and a random signature (a bad
signature for a registered name, an unknown key for another), ``--in-flight`` at
a time; ``polls`` joins under ``--names`` names of its own (claimed: an insecure
server), each hosting one client id from ``--first-id`` on, and keeps ``--calls``
long polls of each open, each opened again when answered. Each prints one JSON
line: what the server answered, by status code.
``--tls-name`` is the name the server's certificate is checked against when the
target is an address it does not name (``ipv6:[::1]:PORT``)."""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc


def _wire() -> ModuleType:
    """The messages generated from federation.proto, loaded from their file alone
    (not through the fedforge package, whose import loads torch)."""
    spec = importlib.util.find_spec("fedforge")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "transport" / "pb" / "federation_pb2.py"
    module_spec = importlib.util.spec_from_file_location("federation_pb2", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


pb: Any = _wire()

HELLO = "/fedforge.v1.Federation/Hello"
PER_CONNECTION = 50  # calls on one channel (one TCP connection each)


def _channel(args: argparse.Namespace, n: int) -> grpc.Channel:
    # a local subchannel pool: each channel its own connection
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", -1)]
    target = args.target
    if args.ca is None:
        return grpc.insecure_channel(target, options=options)
    key = Path(args.key).read_bytes() if args.key else None
    cert = Path(args.cert).read_bytes() if args.cert else None
    creds = grpc.ssl_channel_credentials(Path(args.ca).read_bytes(), key, cert)
    if args.tls_name:
        options.append(("grpc.ssl_target_name_override", args.tls_name))
    return grpc.secure_channel(target, creds, options=options)


def hold_until_told(stop: threading.Event, hold_s: float, calls: int) -> None:
    """Say "holding", then wait ``hold_s`` or until SIGTERM, and set ``stop``.

    The kernel may hand SIGTERM to any thread (gRPC's among them); Python runs
    the handler only when the main thread next runs bytecode, so the main thread
    waits in short steps rather than one long wait, and the handler only flips a
    flag (it takes no lock the main thread could hold)."""
    told = [False]
    signal.signal(signal.SIGTERM, lambda *_: told.__setitem__(0, True))
    print(json.dumps({"event": "holding", "calls": calls}), flush=True)
    end = time.monotonic() + hold_s
    while not told[0] and time.monotonic() < end:
        time.sleep(0.05)
    stop.set()


def idle(args: argparse.Namespace) -> dict[str, object]:
    """``args.calls`` calls held open without their request for ``args.hold_s``:
    a thread a slot, opening a call, waiting until the server ends it (its code
    counted) and opening another."""
    stop = threading.Event()
    codes: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    opened = 0

    def never(over: threading.Event) -> Iterator[pb.Signed]:
        over.wait()  # a request stream that yields nothing until its call is over
        yield from ()

    channels = [_channel(args, i) for i in range(-(-args.calls // PER_CONNECTION))]
    calls = [
        ch.stream_unary(
            HELLO,
            request_serializer=pb.Signed.SerializeToString,
            response_deserializer=pb.HelloReply.FromString,
        )
        for ch in channels
    ]

    def hold(slot: int) -> None:
        nonlocal opened
        while not stop.is_set():
            over = threading.Event()  # ends the request stream's thread with its call
            future = calls[slot // PER_CONNECTION].future(never(over))
            future.add_done_callback(lambda _f, over=over: over.set())
            with lock:
                opened += 1
            while not over.wait(0.1) and not stop.is_set():
                pass
            if not future.done():  # still held when told to stop: not the server's doing
                over.set()
                future.cancel()
                return
            code = future.code().name if future.exception() is not None else "OK"
            with lock:
                codes[code] += 1
            time.sleep(0.05)

    threads = [threading.Thread(target=hold, args=(i,), daemon=True) for i in range(args.calls)]
    for t in threads:
        t.start()
    hold_until_told(stop, args.hold_s, args.calls)
    end = time.monotonic() + 5
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    with lock:
        return {"event": "idle", "opened": opened, "ended": dict(codes)}


def oversize(args: argparse.Namespace) -> dict[str, object]:
    """``args.calls`` Hellos of ``args.mib`` MiB each, sent at once."""
    body = b"\0" * (args.mib << 20)
    channel = _channel(args, 0)
    hello = channel.unary_unary(
        HELLO,
        request_serializer=pb.Signed.SerializeToString,
        response_deserializer=pb.HelloReply.FromString,
    )
    signed = pb.Signed(auth=pb.Auth(client="mallory"), body=body)
    futures = [hello.future(signed, timeout=120) for _ in range(args.calls)]
    codes = collections.Counter(
        f.code().name if f.exception() is not None else "OK" for f in futures
    )
    return {"event": "oversize", "ended": dict(codes)}


def hello(args: argparse.Namespace) -> dict[str, object]:
    """One Hello, its status code and details."""
    channel = _channel(args, 0)
    call = channel.unary_unary(
        HELLO,
        request_serializer=pb.Signed.SerializeToString,
        response_deserializer=pb.HelloReply.FromString,
    )
    try:
        reply = call(pb.Signed(body=pb.HelloRequest().SerializeToString()), timeout=20)
        return {"event": "hello", "code": "OK", "run_name": reply.run_name}
    except grpc.RpcError as exc:
        return {"event": "hello", "code": exc.code().name, "details": exc.details()}


def forged(args: argparse.Namespace) -> dict[str, object]:
    """``args.calls`` Hellos claiming ``args.name``, each signed with random bytes."""
    channel = _channel(args, 0)
    hello = channel.unary_unary(
        HELLO,
        request_serializer=pb.Signed.SerializeToString,
        response_deserializer=pb.HelloReply.FromString,
    )
    body = pb.HelloRequest().SerializeToString()
    codes: collections.Counter[str] = collections.Counter()
    t0 = time.monotonic()
    for start in range(0, args.calls, args.in_flight):
        batch = []
        for _ in range(min(args.in_flight, args.calls - start)):
            proof = pb.Auth(
                client=args.name,
                nonce=os.urandom(16),
                timestamp=time.time(),
                signature=os.urandom(64),
            )
            batch.append(hello.future(pb.Signed(auth=proof, body=body), timeout=60))
        codes.update(f.code().name if f.exception() is not None else "OK" for f in batch)
    seconds = time.monotonic() - t0
    channel.close()
    return {"event": "forged", "ended": dict(codes), "seconds": round(seconds, 3)}


def polls(args: argparse.Namespace) -> dict[str, object]:
    """``args.calls`` long polls of each of ``args.names`` joined names, held."""
    stop = threading.Event()
    codes: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    channels = [_channel(args, i) for i in range(args.names)]

    def unary(ch: grpc.Channel, method: str, reply: Any) -> Any:
        return ch.unary_unary(
            f"/fedforge.v1.Federation/{method}",
            request_serializer=pb.Signed.SerializeToString,
            response_deserializer=reply.FromString,
        )

    def keep(i: int, ch: grpc.Channel) -> None:
        name = f"poller-{i}"
        join = unary(ch, "Join", pb.JoinReply)
        member = pb.Member(client_id=args.first_id + i, num_examples=10)
        body = pb.JoinRequest(members=[member]).SerializeToString()
        session = join(pb.Signed(auth=pb.Auth(client=name), body=body), timeout=30).session
        body = pb.PollRequest(session=session, wait_s=60).SerializeToString()
        poll = unary(ch, "Poll", pb.PollReply)

        def open_one() -> None:
            if stop.is_set():
                return
            future = poll.future(pb.Signed(auth=pb.Auth(client=name), body=body), timeout=90)

            def ended(f: grpc.Future) -> None:
                code = f.code().name if f.exception() is not None else "OK"
                with lock:
                    codes[code] += 1
                if not stop.is_set():
                    time.sleep(0.2)
                    open_one()  # answered: wait again

            future.add_done_callback(ended)

        for _ in range(args.calls):
            open_one()

    for i, ch in enumerate(channels):
        keep(i, ch)
    hold_until_told(stop, args.hold_s, args.names * args.calls)
    for ch in channels:
        ch.close()
    return {"event": "polls", "ended": dict(codes)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("attack", choices=("idle", "oversize", "hello", "forged", "polls"))
    ap.add_argument("--target", required=True)
    ap.add_argument("--calls", type=int, default=250)
    ap.add_argument("--names", type=int, default=20)
    ap.add_argument(
        "--first-id", type=int, default=0, help="polls: the client id of the first name"
    )
    ap.add_argument("--hold-s", type=float, default=20.0)
    ap.add_argument("--mib", type=int, default=120)
    ap.add_argument("--ca", help="the server's CA (PEM): TLS; none: plaintext")
    ap.add_argument("--cert", help="a client certificate to present (PEM)")
    ap.add_argument("--key", help="its private key (PEM)")
    ap.add_argument("--tls-name", help="check the server's certificate for this name")
    ap.add_argument("--name", default="mallory", help="the client name forged calls claim")
    ap.add_argument("--in-flight", type=int, default=16, help="forged calls at once")
    args = ap.parse_args(argv)
    attacks = {"idle": idle, "oversize": oversize, "hello": hello, "forged": forged, "polls": polls}
    attack = attacks[args.attack]
    print(json.dumps(attack(args)), flush=True)
    # said: leave now, not through gRPC's teardown of calls still open (which can
    # outlast a test's wait for this process)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
