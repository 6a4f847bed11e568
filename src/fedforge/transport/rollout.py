"""Evaluation on the clients' own data, at the start of a round: cold start and
canary rollout, and the serving version sent to the clients. ``Rollout`` is the
deployment's ``rollout`` round hook (server/hooks.py), which ``fedforge server``
adds to the run's hooks; the simulator has none. It acts at an upload round's
start (after the round's tasks are made, before any client is asked) and is the
run's gate: the round asks only the clients it names.

**Cold start.** A client that joins is judged before it trains: it first
evaluates the current global model on its own data and reports; until then it
is not eligible for training (a sampled client that has not reported is left
out of the round, as a dropout). The reports are rows of the run store's
``cold_start`` table: how the model does on clients it has never seen.

**Canary.** No new model reaches every client at once. Every global model the
run promotes is a version in the store (``store/versions.py``). Every
``deployment.canary_every`` rounds the current global model becomes a candidate
version, served first to ``canary_fraction`` of the clients (a fixed draw per
client and version, ``transport/canary.py``), which evaluate it and the serving
version on their data; the judge promotes it, or rolls it back when its
metric regressed by more than ``canary_max_drop``. Training goes on from the
global model either way: a rollback keeps a model from being served, it does
not rewind the federation.

Every evaluation report, cold start's and the canary's, is checked field by
field before it counts (:func:`read_canary_report`): a score within the task's range
(accuracy in [0, 1]; R^2 at most 1), a finite loss >= 0, and an example count
at most the evaluation rows the client declared when it joined. A report that
fails is refused with the reason (logged, counted) and does not count.

Evaluation traffic is not counted in the rounds' bytes (it is not training).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from fedforge.config import Config
from fedforge.core import wire
from fedforge.core.errors import StoreError, shown
from fedforge.server.hooks import RoundHook, RoundInfo
from fedforge.store import RunStore
from fedforge.store import versions as vs
from fedforge.tasks import resolve_task
from fedforge.transport.canary import CanaryJudge, CanaryPolicy, in_canary
from fedforge.transport.hub import Hub
from fedforge.transport.logs import log_event
from fedforge.transport.pb import federation_pb2 as pb
from fedforge.transport.work import EVALUATION, SERVED, SERVING, Key

Rows = dict[str, list[tuple[Any, ...]]]
EVALUATION_DEADLINE_S = 60.0  # an evaluation is awaited at most this long
RETRY_ROUNDS = 10  # a new client that did not report is asked again after this many


def model_payload(params: torch.Tensor, round_idx: int) -> bytes:
    """A model to evaluate, dense (the client decodes it without the run's codec)."""
    return wire.encode({"params": params}, {"round_idx": round_idx})


class Rollout(RoundHook):
    """Cold start and canary rollout of one deployment, and the gate that leaves
    out the clients not cold-started yet."""

    name = "rollout"

    def __init__(self, hub: Hub, cfg: Config) -> None:
        dep = cfg.deployment
        self.hub, self.cfg = hub, cfg
        self.deadline_s = min(dep.round_deadline_s, EVALUATION_DEADLINE_S)
        self.cold_start = dep.cold_start
        self.eligible: set[int] = set()  # clients that reported their cold start
        self.asked_at: dict[int, int] = {}  # the round each was last asked to
        self.every = dep.canary_every
        self.policy = CanaryPolicy(
            dep.canary_fraction,
            dep.canary_metric,
            dep.canary_max_drop,
            dep.canary_min_reports,
            higher_is_better=dep.canary_metric == "accuracy",
        )
        # the values the task's score can take: a report outside them is refused
        metrics = resolve_task(cfg).scores()
        self.score_range: tuple[float, float] = getattr(
            metrics, "score_range", (-math.inf, math.inf)
        )
        self.store: RunStore | None = None
        self.delivered: dict[int, int] = {}  # client -> the serving version it acknowledged
        self.sent: dict[int, tuple[Key, int]] = {}  # client -> the SERVE asked, its version
        self.serving_pid: str | None = None

    def bind(self, store: RunStore) -> None:
        """The run's store; a resumed run's clients that reported their cold start
        before stay eligible (they are not new)."""
        self.store = store
        self.eligible |= {int(row[1]) for row in store.read_rows("cold_start")}

    def round_start(self, info: RoundInfo) -> None:
        """An upload round's evaluations (the local and short rounds ask no client);
        the cold-start rows go to the round's outputs, recorded with the round."""
        if info.kind != "upload":
            return
        if self.store is None and info.store is not None:
            self.bind(info.store)
        self.hub.set_phase(f"round {info.round_idx + 1}: evaluation (cold start, canary)")
        info.state.outputs.update(self.begin_round(info.round_idx, info.params))

    def askable(self, info: RoundInfo, ids: Sequence[int]) -> list[int]:
        """The gate: those of the round's cohort that reported their cold start."""
        return self.trainable(ids)

    def begin_round(self, round_idx: int, params: torch.Tensor) -> Rows:
        """Cold-start the clients that joined since, then (when due) a canary."""
        rows: Rows = {}
        if self.cold_start:
            rows["cold_start"] = self._cold_start(round_idx, params)
        if self.store is not None and self.every > 0 and round_idx % self.every == 0:
            self._canary(round_idx, params)
        self._deliver(round_idx, params.dtype)
        return rows

    def trainable(self, ids: Iterable[int]) -> list[int]:
        """Those of ``ids`` that may train (reported their cold start)."""
        return [c for c in ids if not self.cold_start or c in self.eligible]

    # ------------------------------------------------------------ cold start
    def _cold_start(self, round_idx: int, params: torch.Tensor) -> list[tuple[Any, ...]]:
        # a client that did not answer is asked again only after RETRY_ROUNDS rounds:
        # one that never answers would otherwise hold every round to the deadline
        new = [
            c
            for c in sorted(self.hub.members)
            if c not in self.eligible
            and round_idx - self.asked_at.get(c, -RETRY_ROUNDS) >= RETRY_ROUNDS
        ]
        if not new:
            return []
        self.asked_at.update(dict.fromkeys(new, round_idx))
        pid = f"cold-start-{round_idx}"
        reports = self.evaluate(new, model_payload(params, round_idx), pid, "cold_start", round_idx)
        rows = []
        for c, m in sorted(reports.items()):
            self.eligible.add(c)
            rows.append((round_idx, c, m.get("accuracy"), m.get("loss"), int(m["num_examples"])))
        log_event("server", "cold_start", round=round_idx + 1, clients=len(rows), asked=len(new))
        return rows

    # ------------------------------------------------------------ canary
    def _canary(self, round_idx: int, params: torch.Tensor) -> None:
        store = self.store
        assert store is not None
        live = vs.serving(store)
        if live is None:  # the first global model is the first version, served as it is
            vs.add_version(store, params, round_idx, None, {}, status="promoted")
            return
        stale = vs.canary(store)
        if stale is not None:  # a canary still undecided: a newer candidate replaces it
            vs.rollback(store, stale.version_id)
        cand = vs.add_version(store, params, round_idx, live.version_id, {}, status="canary")
        seed = self.cfg.seed
        clients = [
            c
            for c in sorted(self.hub.members)
            if in_canary(c, cand.version_id, self.policy.fraction, seed)
        ]
        judge = CanaryJudge(self.policy, cand.version_id, live.version_id)
        served = vs.load_version_params(store, live.version_id)
        for vid, p in ((cand.version_id, params), (live.version_id, served)):
            label = f"canary-v{cand.version_id}-v{vid}"
            payload = model_payload(p.to(params.dtype), round_idx)
            for c, m in self.evaluate(clients, payload, label, label, round_idx).items():
                judge.report(c, vid, m, int(m["num_examples"]))
        decision = judge.decide()
        vs.update_metrics(store, cand.version_id, decision.metrics())
        kind: str = decision.kind
        reason = decision.reason
        try:
            status = vs.get_version(store, cand.version_id).status
            if status != "canary":  # an operator decided meanwhile (fedforge models)
                kind, reason = "operator", f"left as the operator set it: {status}"
            elif kind == "promote":
                vs.promote(store, cand.version_id)
            elif kind == "rollback":
                vs.rollback(store, cand.version_id)
        except StoreError as exc:  # the operator acted between the look and the change
            kind, reason = "operator", f"left as the operator set it ({exc})"
        log_event(
            "server",
            "canary",
            round=round_idx + 1,
            version=cand.version_id,
            decision=kind,
            reason=reason,
        )

    # ------------------------------------------------------------ serving
    def _deliver(self, round_idx: int, dtype: torch.dtype) -> None:
        """Send the serving version (the promoted one) to every client that has not
        acknowledged it, for its own inference; asked again after 3 rounds without
        an acknowledgement (the hub forgets an unanswered notice then)."""
        live = vs.serving(self.store) if self.store is not None else None
        if live is None:
            return
        for c, (key, vid) in list(self.sent.items()):
            if self.hub.acknowledged(key):
                self.delivered[c] = vid
                del self.sent[c]
        vid, pid = live.version_id, f"{SERVING}{live.version_id}"
        todo = [c for c in sorted(self.hub.members) if self._owes(c, vid, round_idx)]
        if not todo:
            return
        if self.serving_pid != pid:  # a new serving version: its payload replaces the old
            assert self.store is not None
            model = vs.load_version_params(self.store, vid).to(dtype)
            if self.serving_pid is not None:  # and the old one's notices are withdrawn
                self.hub.withdraw(self.serving_pid)
                old = {c: key for c, (key, v) in self.sent.items() if v != vid}
                self.hub.close(set(old.values()))
                for c in old:
                    del self.sent[c]
            self.hub.serve(pid, model_payload(model, live.round_idx), alone=False)
            self.serving_pid = pid
        size = len(self.hub.payloads[pid])
        kind, r = pb.Work.SERVE, round_idx
        works = [
            pb.Work(
                kind=kind,
                client_id=c,
                round_idx=r,
                model_version=vid,
                phase=pid,
                payload_id=pid,
                payload_size=size,
            )
            for c in todo
        ]
        self.hub.ask(works, vid)
        self.sent.update({c: ((c, round_idx, SERVED, pid), vid) for c in todo})
        log_event("server", "serve", round=round_idx + 1, version=vid, clients=len(todo))

    def _owes(self, client_id: int, version_id: int, round_idx: int) -> bool:
        """Whether ``client_id`` is to be sent ``version_id`` now."""
        if self.delivered.get(client_id) == version_id:
            return False
        sent = self.sent.get(client_id)
        return sent is None or sent[1] != version_id or round_idx - sent[0][1] >= 3

    # ------------------------------------------------------------ evaluation
    def evaluate(
        self, ids: list[int], payload: bytes, pid: str, label: str, round_idx: int
    ) -> dict[int, dict[str, float]]:
        """Each of ``ids``' scores of the model in ``payload`` on its own data (the
        ones that answered in time with a well-formed report)."""
        if not ids:
            return {}
        self.hub.serve(pid, payload, alone=False)
        works = [
            pb.Work(
                kind=pb.Work.EVALUATE,
                client_id=c,
                round_idx=round_idx,
                model_version=round_idx,
                phase=label,
                payload_id=pid,
                payload_size=len(payload),
                deadline_s=self.deadline_s,
            )
            for c in ids
        ]
        keys: set[Key] = {(c, round_idx, EVALUATION, label) for c in ids}
        self.hub.ask(works, round_idx)
        out: dict[int, dict[str, float]] = {}
        for a in self.hub.gather(keys, self.deadline_s):
            member = self.hub.members.get(a.client_id)
            declared = member.num_eval_examples if member is not None else 0
            report = read_canary_report(a.data, declared, self.score_range)
            if isinstance(report, str):
                self.hub.on_refusal(
                    "?", a.client_id, f"malformed evaluation of client {a.client_id}: {report}"
                )
                continue
            out[a.client_id] = report
        self.hub.withdraw(pid)
        return out


def read_canary_report(
    data: bytes, declared: int, score_range: tuple[float, float] = (0.0, 1.0)
) -> dict[str, float] | str:
    """A client's evaluation report: JSON of an accuracy (the task's score) within
    ``score_range``, a finite loss >= 0 and num_examples within 0..``declared``
    (the count of examples it evaluates on, as it declared it when it joined);
    else why it is refused, in one line (a report cannot move a decision with a
    count past its declaration or a score no model can have)."""
    try:
        m = json.loads(data.decode())
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "not a JSON report"
    if not isinstance(m, dict):
        return "not a JSON object"
    n = m.get("num_examples")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= declared:
        return f"num_examples = {shown(n)}: must be an integer in 0..{declared} (declared at join)"
    low, high = score_range
    checks = (
        ("accuracy", lambda v: low <= v <= high, f"in [{low:g}, {high:g}]"),
        ("loss", lambda v: 0.0 <= v < math.inf, "a finite number >= 0"),
    )
    out = {"num_examples": float(n)}
    for key, fits, allowed in checks:
        v = m.get(key)
        value = _number(v)
        if value is None or not fits(value):
            return f"{key} = {shown(v)}: must be {allowed}"
        out[key] = value
    return out


def _number(v: object) -> float | None:
    """``v`` as a float when it is a JSON number that fits one (else None)."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    try:
        return float(v)
    except OverflowError:  # an integer past float's range
        return None
