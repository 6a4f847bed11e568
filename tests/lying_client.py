"""A client process that lies in its evaluation reports, for the deployment
tests: ``python tests/lying_client.py HOST:PORT ID...`` (insecure transport).

It is the project's client in every other respect (joins, trains, answers
work as an honest one would) and falsifies only what it says of a model: on
each canary candidate the worst scores the server's field checks let through
(accuracy 0, loss 10^6) and on the serving version the best (accuracy 1, loss
0), so that a judge it could swing would roll back every candidate; its cold
start reports an accuracy of -10^9, a score no model can have."""

from __future__ import annotations

import json
import sys

from fedforge.transport.client import ClientProcess
from fedforge.transport.client_options import ClientOptions
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.security import ClientSecurity


class LyingClient(ClientProcess):
    def _evaluate(self, work: pb.Work) -> bytes:
        report = json.loads(super()._evaluate(work))
        if work.phase.startswith("canary-"):  # "canary-v<candidate>-v<version evaluated>"
            _, candidate, evaluated = work.phase.split("-")
            worst = candidate == evaluated
            report.update(accuracy=0.0 if worst else 1.0, loss=1e6 if worst else 0.0)
        else:  # cold start
            report["accuracy"] = -1e9
        return json.dumps(report).encode()


def main(argv: list[str]) -> int:
    target, ids = argv[0], [int(x) for x in argv[1:]]
    security = ClientSecurity("insecure", "liar")
    options = ClientOptions(target, security, ids, heartbeat_s=0.5, give_up_s=60)
    return LyingClient(options).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
