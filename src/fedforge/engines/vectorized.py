"""The vectorised engine: a chunk of K clients trained as one batched computation.

The K clients' parameters are stacked into one ``[K, P]`` tensor and every local
SGD step is one ``torch.func.vmap`` of the per-client gradient over the stack,
each client on its own minibatch. Clients of uneven sizes are padded to the
chunk's longest schedule: a per-sample mask makes padded samples and padded
steps contribute exactly zero. Minibatch order comes from the same derived
generators as the serial engine, so both compute the same thing (equal to
1e-9 in float64; see tests/test_vectorized.py). Runs where the clients run in
simulation; trusts nothing but the payload, like the serial engine.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.utils.rnn import pad_sequence

from fedforge.algorithms.base import LocalPlan, LossFn
from fedforge.algorithms.local import GradHook, LocalStep, sgd_step_
from fedforge.client.runtime import (
    ClientRuntime,
    ClientTask,
    ClientUpload,
    LocalResult,
    minibatch_generator,
    minibatches,
    on_host,
    trainable_views,
)
from fedforge.core.device import module_device
from fedforge.core.params import ParamSpec
from fedforge.core.precision import forward_context
from fedforge.engines import SimulationEngine
from fedforge.engines.batched_mlp import applies, batched_mlp_sgd, fits, fused_terms, mlp_layers
from fedforge.models.layout import set_channels_last

DEFAULT_MEMORY_BUDGET = 2 * 1024**3  # bytes for one chunk's working set
# The fused perceptron path's clients' weights per thread: 8 2NN clients (6.4 MB),
# as many as stay in cache; more a chunk ran slower, their weights streamed from
# memory twice a step (the figures: docs/changelog.md, "Engine throughput").
FUSED_CACHE_BYTES = 6_500_000
# A client's minibatch schedule is built whole before its chunk trains: per step
# a tensor of indices (a view of its epoch's permutation, ~700 bytes with its
# share of the permutation, measured here at B = 10), then per slot of the
# padded [steps, K, width] tensors an int64 index and a mask byte, and its row
# of the temporary padded block.
SCHEDULE_STEP_BYTES = 700
SCHEDULE_SLOT_BYTES = 17


def schedule_bytes(examples: int, batch: int | None, epochs: int) -> int:
    """The memory one client's schedule takes in a chunk: ``epochs`` epochs of
    ``examples`` examples at batch ``batch`` (None: one full batch an epoch)."""
    if examples == 0:
        return 0
    width = examples if batch is None else min(batch, examples)
    steps = epochs * (1 if batch is None else -(-examples // batch))
    return steps * (SCHEDULE_STEP_BYTES + SCHEDULE_SLOT_BYTES * width)


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot be vectorised (None if it can): batch-norm running
    statistics are buffers updated in place, which vmap cannot batch; torch's fused
    recurrent kernels have no vmap batching rule."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            return f"module '{name}' keeps batch-norm running statistics"
        if isinstance(module, nn.Dropout | nn.Dropout2d) and module.p > 0:
            return f"module '{name}' draws dropout masks from the global RNG"
        if isinstance(module, nn.RNNBase):  # vmap would loop over the clients one by one
            return f"module '{name}' is a recurrent layer, which torch.func.vmap cannot batch"
    return None


def activation_floats(model: nn.Module, sample: torch.Tensor) -> int:
    """Floats of module outputs for one sample: a measure of activation memory."""
    total = 0

    def hook(_m: nn.Module, _i: object, out: object) -> None:
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel()

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.inference_mode():
            model(sample.unsqueeze(0))
    finally:
        for h in handles:
            h.remove()
    return total + sample.numel()


def client_bytes(num_params: int, act_floats: int, batch: int, itemsize: int) -> int:
    """One client's share of a chunk's working memory: parameters, gradients and
    optimizer state, and activations of a ``batch`` (~4x for the backward)."""
    return itemsize * (4 * num_params + 4 * act_floats * batch)


def chunk_size(
    num_params: int, act_floats: int, batch: int, itemsize: int, budget: int, limit: int
) -> int:
    """Clients per chunk so that parameters, gradients and activations of the
    chunk fit in ``budget`` bytes (activations counted ~4x for the backward)."""
    per_client = client_bytes(num_params, act_floats, batch, itemsize)
    return max(1, min(limit, budget // per_client))


def _data_bytes(pair: tuple[torch.Tensor, torch.Tensor]) -> int:
    """A client's data as the chunk holds it: its own copy and the concatenation."""
    x, y = pair
    return 2 * (x.numel() * x.element_size() + y.numel() * y.element_size())


def _step_indices(
    schedules: list[list[torch.Tensor]], offsets: list[int], pad_row: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices ``[S, K, W]`` into the chunk's concatenated data, and the mask
    of real samples. Padding (short batches, finished schedules) points at an
    all-zero row and is masked out."""
    steps = max(len(s) for s in schedules)
    width = max((len(b) for s in schedules for b in s), default=1)
    index = torch.full((steps, len(schedules), width), pad_row, dtype=torch.int64)
    mask = torch.zeros((steps, len(schedules), width), dtype=torch.bool)
    for k, (batches, offset) in enumerate(zip(schedules, offsets, strict=True)):
        if not batches:
            continue
        # One client's batches as one padded [steps, width] block (-1: padding).
        rows = pad_sequence(batches, batch_first=True, padding_value=-1)
        real = rows >= 0
        n, w = rows.shape
        index[:n, k, :w] = torch.where(real, rows + offset, pad_row)
        mask[:n, k, :w] = real
    return index, mask


def vectorized_local_sgd(
    model: nn.Module,
    spec: ParamSpec,
    start: torch.Tensor,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    plan: LocalPlan,
    loss_fn: LossFn,
    gens: list[torch.Generator],
    hook: GradHook | None = None,
    state: Mapping[str, torch.Tensor] | None = None,
    epochs: Sequence[int] | None = None,
    fused: Sequence[str] | None = None,
    lrs: Sequence[float] | None = None,
) -> list[LocalResult]:
    """Local SGD of K clients at once, from the same ``start``; the batched twin of
    :func:`fedforge.client.runtime.local_sgd` (same minibatches, same steps), on
    the device of ``start`` and the data (the schedules are drawn on the host). ``epochs``:
    each client's own number of epochs (stragglers do fewer; default: the plan's);
    ``state``: the algorithm's per-client ``[K, P]`` tensors for ``hook``;
    ``fused``: the linear layers of a perceptron that takes the batched-matmul
    path instead of vmap (engines/batched_mlp.py); ``lrs``: each client's own
    learning rate (default: the plan's)."""
    per_client = epochs if epochs is not None else [plan.local_epochs] * len(ys)
    schedules = [
        [idx for _ in range(e) for idx in minibatches(len(y), plan.batch_size, g)]
        for y, g, e in zip(ys, gens, per_client, strict=True)
    ]
    offsets = [0]
    for y in ys[:-1]:
        offsets.append(offsets[-1] + len(y))
    x_all = torch.cat([*xs, xs[0].new_zeros((1, *xs[0].shape[1:]))])
    y_all = torch.cat([*ys, ys[0].new_zeros((1, *ys[0].shape[1:]))])
    index, mask = _step_indices(schedules, offsets, pad_row=len(y_all) - 1)
    index, mask = index.to(start.device), mask.to(start.device)  # drawn on the host
    lr: float | torch.Tensor = plan.lr  # one lr unless the clients' differ: then [K]
    if lrs is not None and any(r != plan.lr for r in lrs):
        lr = torch.tensor(list(lrs), dtype=start.dtype, device=start.device)
    if fused is not None:
        terms = fused_terms(hook, state)
        if terms is None:  # callers check batched_mlp.applies first
            raise ValueError("the fused perceptron path cannot run this gradient hook")
        params, loss_sum = batched_mlp_sgd(fused, spec, start, x_all, y_all, index, mask, lr, terms)
    else:
        batch = _Batches(x_all, y_all, index, mask)
        params, loss_sum = _vmap_sgd(model, spec, start, batch, plan, loss_fn, hook, state, lr)
    seen = [sum(len(b) for b in s) for s in schedules]
    return [
        LocalResult(params[i].clone(), float(loss_sum[i]) / max(seen[i], 1), len(s))
        for i, s in enumerate(schedules)
    ]


@dataclass(frozen=True)
class _Batches:
    """A chunk's data and its padded steps: rows ``index [S, K, W]`` of
    ``x_all``/``y_all``, ``mask`` marking the real ones."""

    x_all: torch.Tensor
    y_all: torch.Tensor
    index: torch.Tensor
    mask: torch.Tensor


def _vmap_sgd(
    model: nn.Module,
    spec: ParamSpec,
    start: torch.Tensor,
    batches: _Batches,
    plan: LocalPlan,
    loss_fn: LossFn,
    hook: GradHook | None,
    state: Mapping[str, torch.Tensor] | None,
    lr: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The generic path: every step one vmap of the per-client gradient, then the
    shared local step (any hook, any plan; ``lr``: the plan's, or each client's
    ``[K]``). Returns the final parameters ``[K, P]`` and each client's
    summed training loss (float64)."""
    x_all, y_all, index, mask = batches.x_all, batches.y_all, batches.index, batches.mask
    k = index.shape[1]
    weights = mask.to(start.dtype)

    def masked_loss(
        p: dict[str, torch.Tensor],
        fixed: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        m: torch.Tensor,
    ) -> torch.Tensor:
        with forward_context(plan.precision, start.device.type):
            logits = functional_call(model, {**p, **fixed}, (x,))
        per_example = loss_fn(logits.to(start.dtype), y)
        return (per_example * m).sum() / m.sum().clamp(min=1)

    step_fn = vmap(grad_and_value(masked_loss))  # gradients of the trainable entries
    params = start.expand(k, -1).clone()
    # Per-tensor [K, ...] views of the stacked vector: gradients per tensor (no
    # slice-backward into a [P] zero vector), steps written straight into it.
    # Buffers and frozen parameters go in undifferentiated and never move.
    views = spec.views(params)
    names = [e.name for e in spec.entries if e.trainable]
    train = {n: views[n] for n in names}
    fixed = {n: v for n, v in views.items() if n not in train}
    tensors = list(train.values())
    loss_sum = torch.zeros(k, dtype=torch.float64, device=start.device)
    local: LocalStep | None = None
    if hook is not None or not plan.plain:
        anchor = trainable_views(spec, start.unsqueeze(0))
        rows_of = {n: trainable_views(spec, v) for n, v in (state or {}).items()}
        local = LocalStep(plan, tensors, anchor, rows_of, hook, lr)
    active = mask.any(dim=2)  # [S, K]: the client still has a real step
    model.train()
    for step in range(index.shape[0]):
        rows = index[step]
        grads, losses = step_fn(train, fixed, x_all[rows], y_all[rows], weights[step])
        if local is not None:
            live = active[step]
            local([grads[n] for n in names], None if bool(live.all()) else live)
        else:
            sgd_step_(tensors, [grads[n] for n in names], lr)
        loss_sum += losses.detach().to(torch.float64) * mask[step].sum(dim=1)
    return params, loss_sum


class VectorizedEngine(SimulationEngine):
    """Trains the cohort chunk by chunk, each chunk as one vmapped computation,
    and yields the encoded updates in cohort order (streamed: the server's
    running aggregate never holds the whole cohort)."""

    name = "vectorized"

    def __init__(
        self,
        runtime: ClientRuntime,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        max_chunk: int = 64,
    ) -> None:
        reason = unsupported_reason(runtime.model)
        if reason is not None:
            raise ValueError(f"the vectorised engine cannot run this model: {reason}")
        self.runtime = runtime
        # Its own copy of the architecture: vmap cannot batch channels_last.
        self.model = copy.deepcopy(runtime.model)
        set_channels_last(self.model, False)
        self.memory_budget = memory_budget
        self.max_chunk = max_chunk
        self._act_floats: int | None = None
        # loaded, not yet run, by (client, round): a drifting client's rows are its round's
        self._next: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def _take_chunk(
        self, tasks: Sequence[ClientTask], lo: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The data of the next chunk, from ``tasks[lo]``: clients are added while
        the chunk's memory fits the budget. Every client in it is padded to the
        widest batch (the largest client, with full batches) and the longest
        schedule, so each new client costs as much as the widest and longest so
        far; its data counts too. A chunk's clients share one plan but for their
        epochs, learning rates and clip bounds (server/client_lr.py; each
        upload is clipped on its own as it is finished). At least one."""
        rt, widest, held, longest = self.runtime, 1, 0, 0
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        first = tasks[lo].plan
        limit = min(self.max_chunk, self._fused_limit(first))
        while lo + len(pairs) < len(tasks) and len(pairs) < limit:
            task = tasks[lo + len(pairs)]
            own = dataclasses.replace(
                task.plan,
                local_epochs=first.local_epochs,
                lr=first.lr,
                upload_clip=first.upload_clip,
            )
            if own != first:
                break
            key = (task.client_id, task.round_idx)
            pair = self._next.pop(key, None) or rt.client_data(task)
            x, n = pair[0], len(pair[1])
            if self._act_floats is None:  # the shape of one example (a client may have none)
                sample = x.new_zeros(x.shape[1:], device=module_device(self.model))
                self._act_floats = activation_floats(self.model, sample)
            b = task.plan.batch_size
            width = max(widest, n if b is None else min(b, n))
            per = client_bytes(rt.spec.size, self._act_floats, width, x.element_size())
            # every client's schedule is padded to the longest: costs as much
            schedule = max(longest, schedule_bytes(n, b, task.plan.local_epochs))
            cost = (len(pairs) + 1) * (per + schedule) + held + _data_bytes(pair)
            if pairs and cost > self.memory_budget:
                self._next[key] = pair  # the next chunk starts with it
                break
            pairs.append(pair)
            widest, held, longest = width, held + _data_bytes(pair), schedule
        return pairs

    def _fused_limit(self, plan: LocalPlan) -> int:
        """Clients per chunk on the fused perceptron path: as many as keep their
        weights in cache, :data:`FUSED_CACHE_BYTES` a thread (each step streams
        every client's weights twice); no limit on the vmap path."""
        if not fits(self.model, self.runtime.algorithm, plan):
            return self.max_chunk
        per_client = self.runtime.vector_bytes
        return max(1, FUSED_CACHE_BYTES * torch.get_num_threads() // per_client)

    def run_phase(self, phase: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        """Protocol phases are cheap and per client: plain function calls."""
        return self.runtime.run_phase(phase, messages)

    def run_cohort(self, tasks: Sequence[ClientTask], payload: bytes) -> Iterator[ClientUpload]:
        """Each chunk trains on the model's device (its clients' data, the start
        and the algorithm's per-client tensors moved there); every client's
        result comes back to the host for its upload pipeline."""
        if not tasks:
            return
        rt = self.runtime
        start, extras = rt.start_and_extras(payload)
        device = module_device(self.model)
        self._next.clear()
        lo = 0
        while lo < len(tasks):
            t0 = time.perf_counter()
            pairs = self._take_chunk(tasks, lo)
            chunk = tasks[lo : lo + len(pairs)]
            lo += len(chunk)
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            gens = [minibatch_generator(t) for t in chunk]
            alg = rt.algorithm
            ids = [t.client_id for t in chunk]
            state = alg.client.begin(ids, start, extras) if alg.client is not None else None
            plan = chunk[0].plan
            fused = mlp_layers(self.model) if applies(self.model, alg, plan, state) else None
            results = vectorized_local_sgd(
                self.model,
                rt.spec,
                start.to(device),
                [x.to(device) for x in xs],
                [y.to(device) for y in ys],
                plan,
                alg.loss_fn,
                gens,
                alg.grad_hook,
                None if state is None else {k: v.to(device) for k, v in state.items()},
                [t.plan.local_epochs for t in chunk],
                fused,
                [t.plan.lr for t in chunk],
            )
            per_client = (time.perf_counter() - t0) / len(chunk)
            for task, result, x, y in zip(chunk, results, xs, ys, strict=True):
                # one encoded message alive at a time (the server takes each in turn)
                data = rt.conclude(task, start, on_host(result), x, y, extras)
                yield ClientUpload(task.client_id, data, per_client)
