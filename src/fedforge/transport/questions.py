"""The book of the deployment's questions: the work posted to each client, to
which session it was handed, the answers that came and which were taken.

An answer is taken only when it was asked for: the right client, round, model
version, kind and phase, once. The same answer again (a client retrying after
its reply was lost: the same SHA-256) is given the first one's verdict; a
different second answer, and everything else, is refused with its reason. The
hub (``hub.py``) keeps one book and calls it under its lock; nothing here
locks, waits or counts bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.work import (
    ACKNOWLEDGEMENTS,
    EVALUATION,
    KINDS,
    REPLY,
    SERVED,
    Answer,
    Asked,
    Key,
    Verdict,
)

Refuse = Callable[[str, int | None, str], str]


def key_of(work: pb.Work) -> Key:
    kind = KINDS[work.kind]
    phase = work.phase if kind in (REPLY, EVALUATION, SERVED) else ""
    return (work.client_id, work.round_idx, kind, phase)


class Questions:
    """Questions asked, handed out and answered."""

    def __init__(self) -> None:
        self.pending: dict[int, list[Key]] = {}  # per client: work not handed out yet
        self.asked: dict[Key, Asked] = {}
        # each taken answer's SHA-256 and verdict (what a repeat of it is given)
        self.answered: dict[Key, tuple[bytes, Verdict]] = {}
        self.inbox: list[Answer] = []  # taken answers the round thread has not read yet
        self.latest = 0  # the newest round asked about
        self.given: dict[str, set[str]] = {}  # session -> payload ids its work named

    def post(self, works: Iterable[pb.Work], version: int, now: float) -> None:
        for w in works:
            key = key_of(w)
            self.asked[key] = Asked(w, version, now)
            self.answered.pop(key, None)
            self.pending.setdefault(w.client_id, []).append(key)
            self.latest = max(self.latest, w.round_idx)
        # answers of rounds long closed are refused as not asked; forget them, and
        # notices never acknowledged (a client gone for good)
        self.answered = {k: a for k, a in self.answered.items() if k[1] >= self.latest - 1}
        stale = [k for k in self.asked if k[2] in ACKNOWLEDGEMENTS and k[1] < self.latest - 2]
        for k in stale:
            del self.asked[k]

    def reissue(self, cid: int) -> None:
        """A client joining again (its process restarted) is given again the update
        or evaluation it had been handed and not answered: the old process took it
        down with it (a restarted client sends the update it saved, or computes it
        again from its saved state). Not in a secure-aggregation round: the keys of
        its protocol died with the process, so it is a dropout there (its masks are
        recovered from the shares), and the hub stops waiting for it."""
        protocol = {k[1] for k in (*self.asked, *self.answered) if k[0] == cid and k[2] == REPLY}
        for key, asked in self.asked.items():
            if key[0] != cid or asked.handed is None or key[2] == REPLY or key[1] in protocol:
                continue
            asked.handed, asked.session = None, ""
            pending = self.pending.setdefault(cid, [])
            if key not in pending:
                pending.append(key)

    def put_back(self, keys: Iterable[Key], session: str) -> list[Key]:
        """Work handed to ``session`` whose reply never went out (its call ended
        first) is pending again, ahead of newer work, to be handed out anew: the
        keys put back (those still asked and handed to ``session``)."""
        back: list[Key] = []
        for key in keys:
            asked = self.asked.get(key)
            if asked is None or asked.handed is None or asked.session != session:
                continue
            asked.handed, asked.session = None, ""
            back.append(key)
        for cid in {k[0] for k in back}:
            mine = [k for k in back if k[0] == cid]
            rest = [k for k in self.pending.get(cid, []) if k not in mine]
            self.pending[cid] = mine + rest
        return back

    def hand_out(self, ids: list[int], now: float, session: str) -> list[pb.Work]:
        """The pending work of ``ids``, handed to ``session`` now."""
        out = []
        for c in ids:
            for key in self.pending.pop(c, []):
                asked = self.asked.get(key)
                if asked is None:  # closed before it was handed out
                    continue
                asked.handed, asked.session = now, session
                if asked.work.payload_id:
                    self.given.setdefault(session, set()).add(asked.work.payload_id)
                work = pb.Work()
                work.CopyFrom(asked.work)
                work.deadline_s = max(0.0, asked.work.deadline_s - (now - asked.posted))
                out.append(work)
        return out

    def check(
        self, owner: str, ids: list[int], header: pb.UploadHeader, refuse: Refuse
    ) -> str | None:
        """Why an answer with ``header`` from ``owner``'s session hosting ``ids`` is
        not taken now (None: it is), each reason passed through ``refuse``."""
        cid, r = header.client_id, header.round_idx
        key: Key = (cid, r, header.kind, header.phase)
        if cid not in ids:
            return refuse(owner, cid, f"client {cid} is not hosted by '{owner}'")
        first = self.answered.get(key)
        if first is not None:
            if header.sha256 == first[0]:
                return None  # a repeat: given the first one's verdict (``take``)
            return refuse(
                owner, cid, f"a second, different {header.kind} of client {cid} in round {r}"
            )
        asked = self.asked.get(key)
        if asked is None or asked.handed is None:
            what = f"{header.kind}" + (f" '{header.phase}'" if header.phase else "")
            return refuse(owner, cid, f"client {cid} was not asked for a {what} in round {r} now")
        if header.model_version != asked.version:
            return refuse(
                owner,
                cid,
                f"client {cid} answered for model version {header.model_version}; "
                f"it was given version {asked.version}",
            )
        return None

    def take(self, header: pb.UploadHeader, data: bytes, now: float) -> Verdict:
        """Take a checked answer: the verdict its uploader waits for. A new answer
        other than an acknowledgement goes to the inbox; a repeat of a taken one
        is given that one's verdict."""
        key: Key = (header.client_id, header.round_idx, header.kind, header.phase)
        first = self.answered.get(key)
        if first is not None:
            return first[1]
        asked = self.asked.pop(key)
        assert asked.handed is not None
        said = header.timing if header.HasField("timing") else None
        reported = None if said is None else (said.download_s, said.train_s)
        answer = Answer(*key, data, now - asked.handed, reported)
        self.answered[key] = (header.sha256, answer.verdict)
        if header.kind not in ACKNOWLEDGEMENTS:  # a COMMIT's or SERVE's: nobody waits
            self.inbox.append(answer)
        return answer.verdict

    def close(self, keys: set[Key]) -> None:
        """Withdraw ``keys``; answers that came in while the round thread was busy,
        after its count was reached, are never taken."""
        for key in keys:
            self.asked.pop(key, None)
        for a in self.inbox:
            if a.key in keys:
                a.late("closed")  # its upload is answered so
        self.inbox = [a for a in self.inbox if a.key not in keys]


__all__ = ["Questions", "key_of"]
