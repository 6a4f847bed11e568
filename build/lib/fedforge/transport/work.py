"""The vocabulary of the deployment's work: the kinds of answer, the key of one
question to one client, a joined client, an answer taken, and a question asked
(``hub.py`` matches them)."""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.transport.pb import federation_pb2 as pb

# (client id, round, kind, phase): one question to one client
Key = tuple[int, int, str, str]

UPDATE, REPLY, EVALUATION = "update", "reply", "evaluation"
NOTICE = "notice"  # a COMMIT's acknowledgement: kept until acknowledged, nobody waits
SERVED = "served"  # a SERVE's acknowledgement (the serving model kept), likewise
ACKNOWLEDGEMENTS = (NOTICE, SERVED)
TRAINING_PAYLOAD = "round-"  # the prefix of the rounds' payload ids (remote.py)
SERVING = "serving-v"  # the prefix of the serving model's payload id (rollout.py)


KINDS = {
    pb.Work.TRAIN: UPDATE,
    pb.Work.PHASE: REPLY,
    pb.Work.EVALUATE: EVALUATION,
    pb.Work.COMMIT: NOTICE,
    pb.Work.SERVE: SERVED,
}


@dataclass
class Member:
    """A client id the federation knows: who hosts it and what it declared."""

    client_id: int
    owner: str  # the authenticated name of the process that joined it
    num_examples: int  # the examples it trains on
    session: str
    last_seen: float  # time.monotonic() of its process's last poll or heartbeat
    # the examples it evaluates on (cold start, canary): its held-out ones, or
    # its training ones when it has none
    num_eval_examples: int


@dataclass
class Answer:
    """An accepted answer, waiting for the round thread."""

    client_id: int
    round_idx: int
    kind: str
    phase: str
    data: bytes
    seconds: float  # from the work's hand-out to its answer

    @property
    def key(self) -> Key:
        return (self.client_id, self.round_idx, self.kind, self.phase)


@dataclass
class Asked:
    """A question posted to one client: its work, the model version it names,
    when it was posted and handed out, and to which session."""

    work: pb.Work
    version: int
    posted: float
    handed: float | None = None
    session: str = ""  # the session it was handed to
