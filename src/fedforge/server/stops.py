"""Why a run stops before its last round: the privacy budget would be passed, the
bytes it moved reached its byte budget, its recent upload rounds were all
skipped, or most of the updates of its recent upload rounds were refused. The
loop checks them to stop; the round checks them to evaluate the model the run
will end with. Each is a pure function of the config and the loop state that is
checkpointed (skipped and refused updates, round records, bytes moved), so a
resumed run stops where the uninterrupted one does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedforge.config import Config
from fedforge.selection.periods import upload_period
from fedforge.selection.sampling import sample_cohort
from fedforge.server.collectors.base import Collected
from fedforge.server.experiment import Experiment
from fedforge.server.proxy import first_shipped
from fedforge.server.state import LoopState


def stalled(cfg: Config, state: LoopState, last_round: int | None = None) -> str | None:
    """Why the run stops when its last ``robust.max_skipped_rounds`` upload rounds
    were all skipped (the global model unchanged: e.g. every update non-finite
    after a divergence), None otherwise or when the limit is 0. Upload rounds are
    every round, or each period's last with ``upload_every`` > 1 (the rounds before
    it only train locally and are never skipped). ``last_round``: the round just
    run (default: the one before ``state.next_round``). Else :func:`refusing`."""
    limit = cfg.robust.max_skipped_rounds
    if limit <= 0:
        return refusing(cfg, state, last_round)
    skipped = {r for r, _ in state.skipped}
    every = cfg.communication.upload_every
    recent: list[int] = []
    last = state.next_round - 1 if last_round is None else last_round
    for r in range(last, -1, -1):
        if upload_period(r, every, cfg.rounds)[1] != r:
            continue  # a local round of a period
        if r not in skipped:
            return refusing(cfg, state, last_round)
        recent.append(r)
        if len(recent) == limit:
            return (
                f"stopped after {limit} skipped rounds in a row (robust.max_skipped_rounds; "
                f"the global model unchanged since round {r + 1}): {state.skipped[-1][1]}"
            )
    return refusing(cfg, state, last_round)


WITHHELD = "withheld by the client"  # how a refusal by the client's own gate is logged


def refusing(cfg: Config, state: LoopState, last_round: int | None = None) -> str | None:
    """Why the run stops when, over its last ``robust.refused_window`` upload
    rounds, more than ``robust.max_refused_fraction`` of the updates asked for
    were refused (a diverged run in which a few clients still send finite
    updates: its rounds are not skipped, so :func:`stalled` alone never fires).
    An update asked for is one of a client of the round's cohort; one refused is
    a client with a refusal logged that round, but for the updates the client's
    own gate withheld. An update that never arrived (a straggler, a dropout)
    counts as asked and not refused, so it lowers the fraction. None before a
    whole window of upload rounds, or when the fraction is null."""
    most, window = cfg.robust.max_refused_fraction, cfg.robust.refused_window
    if most is None:
        return None
    every = cfg.communication.upload_every
    last = state.next_round - 1 if last_round is None else last_round
    rounds = [r for r in range(last, -1, -1) if upload_period(r, every, cfg.rounds)[1] == r]
    rounds = rounds[:window]
    if len(rounds) < window:
        return None
    first = rounds[-1]
    refused = {
        (r, c) for r, c, why in state.rejected if r >= first and not why.startswith(WITHHELD)
    }
    refused = {(r, c) for r, c in refused if r in rounds}
    sizes = {rec.round_idx: rec.cohort_size for rec in state.records}
    asked = sum(sizes[r] if r in sizes else _cohort_size(cfg, r) for r in rounds)
    if asked == 0 or len(refused) <= most * asked:
        return None
    last_why = next(why for r, c, why in reversed(state.rejected) if (r, c) in refused)
    return (
        f"stopped: {len(refused) / asked:.0%} of the updates of the last {window} upload "
        f"rounds were refused ({len(refused)} of {asked}; robust.max_refused_fraction = "
        f"{most}, robust.refused_window = {window}; since round {first + 1}): {last_why}"
    )


def _cohort_size(cfg: Config, round_idx: int) -> int:
    """The cohort of upload round ``round_idx`` not yet recorded (the round under
    way): drawn as the round draws it, from (seed, its period's first round)."""
    start = upload_period(round_idx, cfg.communication.upload_every, cfg.rounds)[0]
    poisson = cfg.privacy.sampling == "poisson"
    return len(sample_cohort(cfg.num_clients, cfg.client_fraction, cfg.seed, start, poisson))


def over_budget(
    exp: Experiment, next_round: int, spent: dict[str, Any] | None = None
) -> str | None:
    """Why round ``next_round`` must not run: its upload period would take epsilon
    past the target (a release happens at a period's last round, so a period
    that cannot upload is not started: its local rounds would be wasted).
    ``spent``: the loop's privacy state, the participation so far."""
    target = exp.cfg.privacy.target_epsilon
    if target is None or exp.privacy is None:
        return None
    cfg = exp.cfg
    upload = upload_period(next_round, cfg.communication.upload_every, cfg.rounds)[1]
    eps = exp.privacy.epsilon(upload + 1, spent)
    if eps is None or eps <= target:
        return None
    return (
        f"privacy budget: round {upload + 1} would take epsilon to {eps:.3f} > "
        f"privacy.target_epsilon = {target} (delta {exp.privacy.delta:.3g}); stopped"
    )


def bytes_spent(cfg: Config, moved: int, round_idx: int) -> str | None:
    """Why the run stops after round ``round_idx``: ``moved``, the bytes up and down
    of its rounds so far (the summary's ``bytes_up + bytes_down``: updates, payloads,
    the protocol's and the proxy rows' bytes as each round recorded them),
    reached ``communication.byte_budget``. None below it, or with no budget."""
    budget = cfg.communication.byte_budget
    if budget is None or moved < budget:
        return None
    return (
        f"byte budget: {moved:,} bytes moved (up + down) by the end of round "
        f"{round_idx + 1} >= communication.byte_budget = {budget:,}"
    )


def round_bytes(
    exp: Experiment, state: LoopState, collected: Collected, cohort: Sequence[int]
) -> int:
    """The bytes, up and down, that an upload round asking ``cohort`` will record:
    what it collected, and the proxy rows it ships (server/proxy.py)."""
    shipped = first_shipped(exp.proxy, state.selection, cohort)
    return collected.bytes_up + collected.bytes_down + shipped


def ends_run(exp: Experiment, state: LoopState, round_idx: int, moved: int = 0) -> bool:
    """Whether round ``round_idx``, just aggregated, is the run's last: the final
    round, or one after which the loop stops on the privacy budget, the byte
    budget (``moved``: the round's own bytes, up + down, not yet in
    ``state.total_bytes``) or on skipped rounds."""
    if round_idx == exp.cfg.rounds - 1:
        return True
    return (
        over_budget(exp, round_idx + 1, state.privacy) is not None
        or bytes_spent(exp.cfg, state.total_bytes + moved, round_idx) is not None
        or stalled(exp.cfg, state, round_idx) is not None
    )
