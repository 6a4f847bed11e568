"""One round on the server (McMahan et al. 2017, Algorithm 1): cohort, payload,
client work, decode and check each update, aggregate, step, evaluate.

Updates are decoded by the pipeline's codec and refused when malformed (the
client id, round and reason are kept; the global model never sees them).
With a linear aggregator and no cohort stage the server keeps a running sum
(memory O(model)); otherwise it gathers the accepted updates as one ``[K, P]``
tensor for the cohort stages and the aggregator.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from fedforge.client.reports import ClientReport, read_report
from fedforge.client.runtime import ClientTask, encode_payload, split_extras
from fedforge.config import Config
from fedforge.core import wire
from fedforge.core.errors import AggregationError, UploadError, Withheld, shown
from fedforge.core.params import all_finite
from fedforge.data.mnist import NUM_CLASSES
from fedforge.evaluation.evaluate import evaluate
from fedforge.pipeline.codec import CodecContext
from fedforge.pipeline.pipeline import CohortUpdates, StageContext
from fedforge.report.progress import Progress
from fedforge.robust import discount_faulty
from fedforge.selection.periods import period_plan, upload_period
from fedforge.selection.sampling import sample_cohort
from fedforge.server import diagnostics
from fedforge.server.experiment import Experiment
from fedforge.server.hierarchy import Edges
from fedforge.server.labels import read_labels
from fedforge.server.state import LoopState
from fedforge.server.stops import ends_run
from fedforge.server.stragglers import cohort_tasks
from fedforge.store import ClientRecord, RoundRecord


@dataclass
class Upload:
    """A decoded, well-formed update."""

    client_id: int
    delta: torch.Tensor
    num_examples: int
    train_loss: float
    nbytes: int
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. SCAFFOLD's delta c_k
    report: ClientReport | None = None  # val_loss / label_counts for the weights (reports.py)


class Gathering:
    """A gathered round's accepted uploads: each delta is copied into the next row
    of one ``[capacity, P]`` tensor as it arrives and its own tensor dropped, so
    the round holds the cohort once (a list of deltas and then their stack held
    it twice). Rows are allocated on the first upload, in its dtype."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.uploads: list[Upload] = []
        self._rows: torch.Tensor | None = None

    def add(self, up: Upload) -> None:
        if self._rows is None:
            self._rows = torch.empty(self.capacity, up.delta.numel(), dtype=up.delta.dtype)
        n = len(self.uploads)
        if n == self.capacity:
            raise RuntimeError(f"more uploads than the {self.capacity} tasks of the round")
        row = self._rows[n]
        row.copy_(up.delta)
        up.delta = row
        self.uploads.append(up)

    def updates(self) -> torch.Tensor:
        """The ``[K, P]`` accepted deltas so far, in arrival order (a view)."""
        assert self._rows is not None, "no upload gathered"
        return self._rows[: len(self.uploads)]


def check_update(exp: Experiment, client_id: int, round_idx: int, data: bytes) -> Upload:
    """Decode one update and refuse anything that is not a well-formed delta."""
    msg = wire.decode(data)
    if "withheld" in msg.meta:  # the client's own gate kept its update back
        raise Withheld(f"withheld by the client: {msg.meta['withheld']!s:.300}")
    dtype = exp.initial_params.dtype
    ctx = CodecContext(exp.cfg.seed, round_idx, client_id)
    own, extras = split_extras(msg.tensors)
    delta = exp.pipeline.codec.decode(own, msg.meta, exp.spec.size, dtype, ctx)
    if tuple(delta.shape) != (exp.spec.size,) or delta.dtype != dtype:
        raise UploadError(
            f"decoded delta has shape {shown(tuple(delta.shape))} and dtype {delta.dtype}; "
            f"expected ({exp.spec.size},) {dtype}"
        )
    if not all_finite(delta):
        raise UploadError("delta holds non-finite values (NaN or inf)")
    n, train_loss = read_labels(msg.meta, client_id, round_idx)
    report = read_report(msg.meta, exp.cfg.aggregation_weights, n, NUM_CLASSES)
    return Upload(client_id, delta, n, train_loss, len(data), _check_extras(exp, extras), report)


def _check_extras(exp: Experiment, extras: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The algorithm's tensors an update must carry beside the delta (SCAFFOLD's
    delta c_k), each refused unless [P], the run's dtype and finite."""
    server = exp.algorithm.server
    wanted = () if server is None else server.update_tensors
    unexpected = sorted(set(extras) - set(wanted))
    if unexpected:
        raise UploadError(
            f"update carries unexpected algorithm tensors {', '.join(unexpected)[:200]}; "
            f"{exp.cfg.algorithm} sends {', '.join(wanted) or 'none'}"
        )
    if server is None:
        return {}
    size, dtype = exp.spec.size, exp.initial_params.dtype
    for name in server.update_tensors:
        t = extras.get(name)
        if t is None or tuple(t.shape) != (size,) or t.dtype != dtype:
            got = "nothing" if t is None else f"{shown(tuple(t.shape))} {t.dtype}"
            raise UploadError(f"'{name}' must be ({size},) {dtype}; the update carries {got}")
        if not all_finite(t):
            raise UploadError(f"'{name}' holds non-finite values (NaN or inf)")
    return {name: extras[name] for name in server.update_tensors}


def _reject(state: LoopState, bar: Progress, round_idx: int, client_id: int, why: str) -> None:
    if len(why) > MAX_REASON:  # kept in every later checkpoint: a client cannot fill it
        why = why[: MAX_REASON - 3] + "..."
    state.rejected.append((round_idx, client_id, why))
    bar.write(f"round {round_idx + 1}: update of client {client_id} rejected: {why}")


def _skip(state: LoopState, bar: Progress, round_idx: int, why: str) -> None:
    state.skipped.append((round_idx, why))
    bar.write(f"round {round_idx + 1}: skipped, the global model is unchanged: {why}")


def _too_few(exp: Experiment, accepted: int) -> str | None:
    need = exp.cfg.robust.min_clients
    if accepted < need:
        return f"only {accepted} accepted update(s), fewer than min_clients = {need}"
    return None


def _gathered_aggregate(
    exp: Experiment,
    gathering: Gathering,
    state: LoopState,
    round_idx: int,
    bar: Progress,
    faulty: int = 0,
    diag: diagnostics.RoundDiagnostics | None = None,
) -> tuple[torch.Tensor | None, dict[int, float]]:
    """Cohort stages, then the aggregator, over the accepted uploads as one
    ``[K, P]`` tensor; returns the aggregate (None if nothing is left) and the
    clients it used, each with the norm of the row it took (a colluding
    attacker's rewritten row, not its honest one). ``faulty`` uploads were refused as malformed or
    non-finite: Krum and Bulyan count them among their f (``discount_faulty``).
    ``diag`` gets the updates the aggregator took."""
    uploads = gathering.uploads
    if not uploads:
        return None, {}
    cohort = CohortUpdates(
        [u.client_id for u in uploads],
        gathering.updates(),
        torch.tensor([float(u.num_examples) for u in uploads], dtype=torch.float64),
        {u.client_id: u.report for u in uploads},
    )
    ctx = StageContext(round_idx, exp.cfg.seed)
    for stage in exp.pipeline.cohort:
        cohort, refused = stage.apply(cohort, ctx)
        for client_id, why in refused:
            _reject(state, bar, round_idx, client_id, f"{stage.name}: {why}")
    if not cohort.client_ids:
        return None, {}
    too_few = _too_few(exp, len(cohort.client_ids))
    if too_few is not None:
        _skip(state, bar, round_idx, too_few)
        return None, {}
    aggregator = discount_faulty(exp.pipeline.aggregator, faulty)
    if aggregator is not exp.pipeline.aggregator:
        f, lowered = exp.pipeline.aggregator.f, aggregator.f  # type: ignore[attr-defined]
        bar.write(
            f"round {round_idx + 1}: {aggregator.name}: f = {f} lowered to {lowered}: "
            f"{faulty} refused upload(s) were faulty"
        )
    try:
        aggregate = aggregator.aggregate(cohort.updates, cohort.weights)
    except AggregationError as exc:  # e.g. Krum left with fewer than 2f + 3 updates
        _skip(state, bar, round_idx, str(exc))
        return None, {}
    if diag is not None:
        losses = {u.client_id: u.train_loss for u in uploads}
        for c, row in zip(cohort.client_ids, cohort.updates, strict=True):
            diag.add(c, row, losses[c])
    norms = [float(row.norm()) for row in cohort.updates]  # as the upload's own norm
    return aggregate, dict(zip(cohort.client_ids, norms, strict=True))


def _poisson(cfg: Config) -> bool:
    return cfg.privacy.sampling == "poisson"  # DP-FedAvg: each client with probability C


MAX_REASON = 500  # characters of a refusal's reason that are kept
FLOAT32_BYTES = 4  # paper_bytes: what dense float32 messages would cost (2 |w| K 4)


@dataclass(frozen=True)
class DenseCost:
    """What one message costs as dense float32: the model, or the delta, and the
    algorithm's tensors beside it (SCAFFOLD's c down, delta c_k up)."""

    down: int
    up: int

    @classmethod
    def of(cls, exp: Experiment, payload_tensors: dict[str, torch.Tensor] | None) -> DenseCost:
        server, size = exp.algorithm.server, exp.spec.size
        more = sum(t.numel() for t in (payload_tensors or {}).values())
        extra_up = size * len(server.update_tensors) if server is not None else 0
        return cls(FLOAT32_BYTES * (size + more), FLOAT32_BYTES * (size + extra_up))


def _local_round(exp: Experiment, round_idx: int, start: int, t0: float) -> RoundRecord:
    """A round inside an upload period (``upload_every`` > 1): its cohort trains
    locally (the work is done with the period's last round), nothing travels."""
    cfg = exp.cfg
    cohort = sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, start, _poisson(cfg))
    return RoundRecord(
        round_idx=round_idx,
        cohort_size=len(cohort),
        train_loss=float("nan"),
        test_accuracy=None,
        test_loss=None,
        bytes_up=0,
        bytes_down=0,
        paper_bytes=0,
        lr=exp.algorithm.plan(start).lr,
        seconds=time.perf_counter() - t0,
        float32_up=0,
        float32_down=0,
    )


def _secure(
    exp: Experiment,
    state: LoopState,
    round_idx: int,
    bar: Progress,
    tasks: Sequence[ClientTask],
    payload: bytes,
) -> tuple[torch.Tensor | None, dict[int, ClientRecord], int, int, tuple[int, int]]:
    """Secure aggregation's round (``server/secure.py``): the aggregate of the
    unmasked sum (None: the round is skipped with the reason), the clients in the
    sum, bytes up (masked updates, phase replies), bytes down (phase messages, and the
    payload to the clients still in the protocol at masked input), and how many
    clients got the payload and sent a masked update."""
    from fedforge.server.secure import secure_round  # imports ``cryptography``: only when masking

    out = secure_round(exp, round_idx, tasks, payload)
    for client_id, why in out.refused:
        _reject(state, bar, round_idx, client_id, why)
    reason = out.reason
    if reason is None and out.aggregate is not None:
        reason = _too_few(exp, len(out.clients))
    if reason is not None:
        _skip(state, bar, round_idx, reason)
        return None, {}, out.bytes_up, out.bytes_down, (out.payloads, out.masked_updates)
    return (
        out.aggregate,
        out.clients,
        out.bytes_up,
        out.bytes_down,
        (out.payloads, out.masked_updates),
    )


def run_round(
    exp: Experiment, state: LoopState, round_idx: int, bar: Progress
) -> tuple[RoundRecord, list[ClientRecord]]:
    """One round: cohort, payload, client work, checks, aggregate, step, evaluation."""
    cfg, params, pipeline = exp.cfg, state.params, exp.pipeline
    t0 = time.perf_counter()
    start, end = upload_period(round_idx, cfg.communication.upload_every, cfg.rounds)
    if round_idx != end:  # the period's cohort trains locally: nothing travels
        return _local_round(exp, round_idx, start, t0), []
    cohort = sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, start, _poisson(cfg))
    if exp.privacy is not None:  # e.g. the round's adaptive clip norm
        exp.privacy.begin_round(state.privacy, round_idx)
    plan = period_plan(exp.algorithm, start, end)
    comm = exp.comm
    server = exp.algorithm.server  # an algorithm's server state (SCAFFOLD's c) travels too
    more = server.payload(state.algorithm_state) if server is not None else None
    payload = encode_payload(params, round_idx, comm.downlink if comm else None, cfg.seed, more)
    dense = DenseCost.of(exp, more)
    tasks = cohort_tasks(cfg, exp.algorithm, cohort, round_idx, plan)  # stragglers
    extras: dict[int, dict[str, torch.Tensor]] = {}
    # Streaming: a running sum, O(model) memory. Otherwise: gather the cohort.
    acc = pipeline.aggregator.start(exp.spec.size, params.dtype) if pipeline.streams else None
    edges = None  # hierarchical: client updates go to their group's edge first
    if comm is not None and comm.group_of is not None and acc is not None:
        edges = Edges(comm.group_of, exp.spec.size, params.dtype)
    hops = len(edges.groups_of(cohort)) if edges is not None else 0  # server <-> edge messages
    gathering = Gathering(len(tasks))
    clients: dict[int, ClientRecord] = {}
    bytes_up = 0
    secure = exp.privacy.secagg if exp.privacy is not None else None  # secure aggregation
    payload_down = len(payload) * (len(cohort) + hops)  # the model to every client, edge
    phase_down = 0  # secure aggregation: its messages and the payload, to whom they went
    ids = [t.client_id for t in tasks]  # drift diagnostics: the global loss before training
    diag = diagnostics.start_round(exp, ids, params, secure is not None)
    uploads = exp.engine.run_cohort(tasks, payload) if secure is None else iter(())
    faulty = 0  # uploads refused as malformed or non-finite: faults for certain
    for upload in uploads:
        bytes_up += len(upload.data)
        try:
            up = check_update(exp, upload.client_id, round_idx, upload.data)
        except UploadError as exc:
            faulty += not isinstance(exc, Withheld)
            _reject(state, bar, round_idx, upload.client_id, str(exc))
            continue
        up.delta = pipeline.run_upload(up.delta, StageContext(round_idx, cfg.seed, up.client_id))
        if diag is not None and acc is not None:  # streaming: accepted as it comes
            diag.add(up.client_id, up.delta, up.train_loss)
        extras[up.client_id] = up.extras
        clients[up.client_id] = ClientRecord(
            round_idx,
            up.client_id,
            up.num_examples,
            up.train_loss,
            float(up.delta.norm()) if acc is not None else math.nan,  # gathered: after stages
            up.nbytes,
            len(payload),
        )
        if edges is not None:
            edges.add(up.client_id, up.delta, float(up.num_examples), up.extras)
        elif acc is not None:
            acc.add(up.delta, float(up.num_examples))
        else:
            gathering.add(up)
    # update messages that arrived: the refused as faulty, and the decoded (a
    # withheld note carries no update)
    float32_up = dense.up * (faulty + len(clients))
    float32_down = dense.down * (len(cohort) + hops)
    if edges is not None and acc is not None:
        bytes_up += edges.forward(acc, round_idx, lambda e: _check_extras(exp, e))
        # each edge's mean and its sums of the algorithm's tensors: an update's cost
        float32_up += dense.up * edges.forwarded
    if acc is not None:
        aggregate = acc.result() if acc.count else None
        why = _too_few(exp, len(clients)) if acc.count else None  # clients, not edges
        if why is None and edges is not None and edges.refused is not None:
            why = edges.refused  # an edge's message the server refused: its clients too
        if why is not None:
            aggregate, clients = None, {}
            _skip(state, bar, round_idx, why)
            if diag is not None:
                diag.clear()
    else:
        aggregate, used = _gathered_aggregate(exp, gathering, state, round_idx, bar, faulty, diag)
        clients = {c: replace(r, update_norm=used[c]) for c, r in clients.items() if c in used}
    diagnostics.end_round(exp, diag, state.diagnostics, state.outputs, bar, round_idx)
    if secure is not None:  # the server sees only masked updates and their sum
        aggregate, clients, bytes_up, phase_down, (got, sent) = _secure(
            exp, state, round_idx, bar, tasks, payload
        )
        float32_up, float32_down = dense.up * sent, dense.down * got
        payload_down = 0  # counted by the protocol: a client that dropped got none
        extras = {c: {} for c in clients}
    if aggregate is not None:
        ctx = StageContext(round_idx, cfg.seed, state=state.privacy)  # e.g. central DP noise
        aggregate = pipeline.run_aggregate(aggregate, ctx)
        if not all_finite(aggregate):  # finite updates, too large to sum
            aggregate, clients = None, {}
            _skip(state, bar, round_idx, f"the aggregate overflowed {params.dtype} (inf or NaN)")
    moved = None  # the algorithm's server state after the round (SCAFFOLD's c)
    if aggregate is not None and server is not None:
        received = edges.received if edges is not None else [extras[c] for c in clients]
        moved = server.moved(state.algorithm_state, received, cfg.num_clients)
        bad = [name for name, t in moved.items() if not all_finite(t)]
        if bad:  # finite control deltas, too large to sum: c would be inf for good
            aggregate, clients, moved = None, {}, None
            _skip(state, bar, round_idx, f"the server's {', '.join(bad)} overflowed (inf or NaN)")
    if aggregate is not None:
        state.params = state.optimizer.step(params, aggregate)
        personal = exp.algorithm.personal
        if personal is not None:  # FedBN: the global batch-norm entries never move
            state.params = state.params.masked_scatter(personal.mask, params[personal.mask])
        frozen = exp.spec.frozen_mask()
        if frozen is not None:  # DP noise or server momentum would move them: they stay
            state.params = state.params.masked_scatter(frozen, params[frozen])
        if exp.privacy is not None:  # adaptive clipping: the next clip norm
            exp.privacy.end_round(state.privacy, round_idx, clients)
        if moved is not None:  # e.g. c += sum of the used clients' delta c_k / N
            state.algorithm_state = moved
    elif not state.skipped or state.skipped[-1][0] != round_idx:
        _skip(state, bar, round_idx, "no valid update")
    if exp.algorithm.client is not None:  # SCAFFOLD: c_k+ of the used clients only
        exp.algorithm.client.commit(clients if aggregate is not None else ())
    test_acc = test_loss = None
    every = cfg.eval_every  # a period's model is new at its end: due if any round of it was
    if (round_idx + 1) // every > start // every or ends_run(exp, state, round_idx):
        data = exp.data
        ev = evaluate(
            exp.model, exp.spec, state.params, data.test_x, data.test_y, cfg.eval_batch_size
        )
        test_acc, test_loss = ev.accuracy, ev.loss
        state.eval_rounds.append(round_idx + 1)
        state.eval_accuracy.append(ev.accuracy)
        if cfg.eval_clients:  # each client's held-out slice, per-class test accuracy
            state.outputs.update(diagnostics.evaluation_rows(exp, state.params, round_idx))
    records = list(clients.values())
    # weighted by examples, over the clients that reported a finite loss (none
    # under privacy modes that hide it: NaN)
    reported = [c for c in records if math.isfinite(c.train_loss)]
    seen = sum(c.num_examples for c in reported)
    record = RoundRecord(
        round_idx=round_idx,
        cohort_size=len(cohort),
        train_loss=sum(c.train_loss * c.num_examples for c in reported) / seen
        if seen
        else float("nan"),
        test_accuracy=test_acc,
        test_loss=test_loss,
        bytes_up=bytes_up,
        bytes_down=payload_down + phase_down,
        paper_bytes=2 * FLOAT32_BYTES * exp.spec.size * (len(cohort) + hops),
        lr=plan.lr,
        seconds=time.perf_counter() - t0,
        float32_up=float32_up,
        float32_down=float32_down,
    )
    return record, records
