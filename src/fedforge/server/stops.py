"""Why a run stops before its last round: the privacy budget would be passed, or
its recent upload rounds were all skipped. The loop checks them to stop; the
round checks them to evaluate the model the run will end with."""

from __future__ import annotations

from fedforge.config import Config
from fedforge.selection.periods import upload_period
from fedforge.server.experiment import Experiment
from fedforge.server.state import LoopState


def stalled(cfg: Config, state: LoopState, last_round: int | None = None) -> str | None:
    """Why the run stops when its last ``robust.max_skipped_rounds`` upload rounds
    were all skipped (the global model unchanged: e.g. every update non-finite
    after a divergence), None otherwise or when the limit is 0. Upload rounds are
    every round, or each period's last with ``upload_every`` > 1 (the rounds before
    it only train locally and are never skipped). ``last_round``: the round just
    run (default: the one before ``state.next_round``)."""
    limit = cfg.robust.max_skipped_rounds
    if limit <= 0:
        return None
    skipped = {r for r, _ in state.skipped}
    every = cfg.communication.upload_every
    recent: list[int] = []
    last = state.next_round - 1 if last_round is None else last_round
    for r in range(last, -1, -1):
        if upload_period(r, every, cfg.rounds)[1] != r:
            continue  # a local round of a period
        if r not in skipped:
            return None
        recent.append(r)
        if len(recent) == limit:
            return (
                f"stopped after {limit} skipped rounds in a row (robust.max_skipped_rounds; "
                f"the global model unchanged since round {r + 1}): {state.skipped[-1][1]}"
            )
    return None


def over_budget(exp: Experiment, next_round: int) -> str | None:
    """Why round ``next_round`` must not run: its upload period would take epsilon
    past the target (a release happens at a period's last round, so a period
    that cannot upload is not started: its local rounds would be wasted)."""
    target = exp.cfg.privacy.target_epsilon
    if target is None or exp.privacy is None:
        return None
    cfg = exp.cfg
    upload = upload_period(next_round, cfg.communication.upload_every, cfg.rounds)[1]
    eps = exp.privacy.epsilon(upload + 1)
    if eps is None or eps <= target:
        return None
    return (
        f"privacy budget: round {upload + 1} would take epsilon to {eps:.3f} > "
        f"privacy.target_epsilon = {target} (delta {exp.privacy.delta:.3g}); stopped"
    )


def ends_run(exp: Experiment, state: LoopState, round_idx: int) -> bool:
    """Whether round ``round_idx``, just aggregated, is the run's last: the final
    round, or one after which the loop stops on the budget or on skipped rounds."""
    if round_idx == exp.cfg.rounds - 1:
        return True
    return (
        over_budget(exp, round_idx + 1) is not None
        or stalled(exp.cfg, state, round_idx) is not None
    )
