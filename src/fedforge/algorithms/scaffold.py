"""SCAFFOLD: Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging
for Federated Learning" (ICML), Algorithm 1.

Client k keeps a control variate c_k (zero at first), the server keeps c (zero
at first) and sends it with the payload. Local steps use the corrected
gradient g - c_k + c (a gradient hook, so both engines run it). After K local
steps at learning rate lr from the server model x to y_k, the client's new control is

    option I:  c_k+ = grad f_k(x)                      (full batch over its data)
    option II: c_k+ = c_k - c + (x - y_k) / (K lr)

and its update carries delta y_k (through the pipeline's codec) and
delta c_k = c_k+ - c_k (dense, beside it: its bytes are counted). The server
applies the aggregate of the delta y_k with its optimizer (server_optimizer.lr is the
paper's global step size; the default aggregate is the n_k-weighted mean where
the paper averages uniformly) and moves c by (|S|/N) times the mean of the
accepted delta c_k, i.e. c += sum(delta c_k) / N.

Runs on both sides. The c_k are persistent per-client state (a
:class:`~fedforge.store.ClientStateStore`, table ``control``, saved by
checkpoints); c is server state saved with the checkpoint. In simulation the
client table lives beside the loop state, like error-feedback residuals.
With ``scaffold.controls`` (a regular expression on tensor names) only the
matching entries have controls: c, c_k and delta c_k are vectors of those M
entries (the upload's extra is 4M bytes in float32, not 4P), and the other
entries train without correction, as FedAvg's.

Trusts the clients' delta c_k once they pass the server's shape/finite checks.

The paper keeps c = (1/N) sum c_k at every round; a server that refuses updates
(a gate, a robust aggregator, too few clients, an overflowing aggregate) must
keep it too. So a client holds its c_k+ pending until the server has used its
update (``commit``: in a deployment, the server's acknowledgement), and a
refused update or a skipped round leaves its c_k as it was; otherwise c_k would move
while c never saw its delta c_k, and every later correction c - c_k would be off
(by 0.07 in a test run whose rounds were all skipped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from fedforge.algorithms.base import Algorithm, cross_entropy
from fedforge.algorithms.local import ClientJob, LinearTerm, StepContext
from fedforge.algorithms.plan import DecayedPlan, LocalPlan
from fedforge.algorithms.terms import PendingClientTable, summed
from fedforge.store.client_state import ClientStateStore

Option = Literal["I", "II"]
CONTROL = "control"  # payload: the server control c
CONTROL_DELTA = "control_delta"  # update: delta c_k
CORRECTION = "correction"  # per client during training: c - c_k


@dataclass(frozen=True)
class Correction:
    """Adds c - c_k to every gradient: g - c_k + c (declared as a linear term,
    which fast paths fold into their update)."""

    def linear_term(self) -> LinearTerm:
        return LinearTerm(state={CORRECTION: 1.0})

    def __call__(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        self.linear_term()(grads, ctx)


class ScaffoldClient(PendingClientTable):
    """The client half: reads c_k from its table, computes c_k+ and holds it until
    the server has used the client's update."""

    def __init__(
        self, store: ClientStateStore, option: Option = "II", mask: torch.Tensor | None = None
    ) -> None:
        if option not in ("I", "II"):
            raise ValueError(f"SCAFFOLD option {option!r} must be 'I' or 'II'")
        if mask is not None and int(mask.sum()) != store.size:
            raise ValueError(f"control rows of {store.size} for {int(mask.sum())} entries")
        super().__init__(CONTROL, store)
        self.option = option
        self.mask = mask  # the entries with controls; None: all

    def begin(
        self, client_ids: Sequence[int], start: torch.Tensor, extras: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        c = _server_control(extras, self.store.size, start.dtype)
        correction = c.unsqueeze(0) - self.rows(client_ids, start.dtype)
        if self.mask is None:
            return {CORRECTION: correction}
        full = torch.zeros(len(client_ids), start.numel(), dtype=start.dtype)
        full[:, self.mask] = correction  # no correction outside the controlled entries
        return {CORRECTION: full}

    def end(self, job: ClientJob) -> dict[str, torch.Tensor]:
        ck = self.rows([job.client_id], job.start.dtype)[0]
        if self.option == "I":
            new = self._own(job.grad_fn(job.start, job.x, job.y))
        else:
            c = _server_control(job.extras, self.store.size, job.start.dtype)
            steps = max(job.result.steps, 1)
            new = ck - c + self._own(job.start - job.result.params) / (steps * job.lr)
        self.hold(job.client_id, new)  # a blown-up run keeps its old control
        return {CONTROL_DELTA: new - ck}

    def _own(self, vec: torch.Tensor) -> torch.Tensor:
        """The controlled entries of a ``[P]`` vector."""
        return vec if self.mask is None else vec[self.mask]


def _server_control(
    extras: Mapping[str, torch.Tensor], size: int, dtype: torch.dtype
) -> torch.Tensor:
    c = extras.get(CONTROL)
    if c is None or tuple(c.shape) != (size,):
        raise ValueError(f"a SCAFFOLD payload must carry the server control 'control' [{size}]")
    return c.to(dtype)


class ScaffoldServer:
    """The server half: keeps c, sends it, moves it by sum(delta c_k) / N."""

    update_tensors: tuple[str, ...] = (CONTROL_DELTA,)

    def __init__(self, controlled: int | None = None) -> None:
        # entries with controls (a subset of the model); None: all P
        self.controlled = controlled
        self.update_sizes = {} if controlled is None else {CONTROL_DELTA: controlled}

    def initial_state(self, size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        n = size if self.controlled is None else self.controlled
        return {CONTROL: torch.zeros(n, dtype=dtype)}

    def payload(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {CONTROL: state[CONTROL]}

    def admit(
        self, delta: torch.Tensor, extras: Mapping[str, torch.Tensor], num_examples: int
    ) -> dict[str, torch.Tensor]:
        """delta c_k as it came: a [P] vector, bounded as the update is (intake.py)."""
        return dict(extras)

    def moved(
        self,
        state: Mapping[str, torch.Tensor],
        extras: Sequence[Mapping[str, torch.Tensor]],
        num_clients: int,
    ) -> dict[str, torch.Tensor]:
        if not extras:
            return dict(state)
        total = summed(extras, CONTROL_DELTA)
        # (|S| / N) * mean over S of delta c_k
        return {CONTROL: state[CONTROL] + total.to(state[CONTROL].dtype) / num_clients}


def scaffold(
    plan: LocalPlan,
    store: ClientStateStore,
    option: Option = "II",
    lr_decay: float = 1.0,
    drop_stragglers: bool = True,
    mask: torch.Tensor | None = None,
) -> Algorithm:
    """SCAFFOLD on FedAvg's local ``plan`` (its lr decayed by ``lr_decay`` a round),
    with client controls kept in ``store`` (``[N, P]``, run dtype; ``[N, M]`` with
    ``mask``, the M entries that have controls: the others are plain FedAvg)."""
    return Algorithm(
        "scaffold",
        DecayedPlan(plan, lr_decay),
        cross_entropy,
        grad_hook=Correction(),
        client=ScaffoldClient(store, option, mask),
        server=ScaffoldServer(None if mask is None else int(mask.sum())),
        drop_stragglers=drop_stragglers,
    )
