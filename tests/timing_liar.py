"""A client process that lies about its times, for the deployment tests:
``python tests/timing_liar.py HOST:PORT ID...`` (insecure transport).

It is the project's client in every other respect and falsifies only the
seconds its update's header reports: a download of 0 s and a training of
10^6 s, more than any round the server measures (a liar out to look slow, or
broken); the server refuses the report and keeps its own total."""

from __future__ import annotations

import sys

from fedforge.transport.client import ClientProcess
from fedforge.transport.client_options import ClientOptions
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.security import ClientSecurity


class TimingLiar(ClientProcess):
    def _train(self, work: pb.Work) -> tuple[bytes, pb.Timing | None]:
        data, _ = super()._train(work)
        return data, pb.Timing(download_s=0.0, train_s=1e6)


def main(argv: list[str]) -> int:
    target, ids = argv[0], [int(x) for x in argv[1:]]
    security = ClientSecurity("insecure", "timing-liar")
    options = ClientOptions(target, security, ids, heartbeat_s=0.5, give_up_s=60)
    return TimingLiar(options).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
