"""Which clients a round asks: the pool it may draw from (every client in
simulation, a deployment's connected ones) and the run's selection policy's
draw from it (selection/named.py), checked. DP-FedAvg's Poisson sampling
(``privacy.sampling``) draws each client with probability C in the policy's
place: it is only allowed with the uniform policy (config/selection.py)."""

from __future__ import annotations

import math

from fedforge.config.compat import cohort_size
from fedforge.core.errors import ConfigError
from fedforge.selection.history import History
from fedforge.selection.named import SelectionRound
from fedforge.selection.sampling import cohort_rng, over_selected, sample_cohort
from fedforge.server.experiment import Experiment


def sample(
    exp: Experiment, start: int, among: list[int] | None = None, history: History | None = None
) -> list[int]:
    """The sorted cohort of the upload period starting at ``start`` (``among``:
    drawn from these clients only), by the run's policy from what the server
    knows of the clients (``history``: none known when None)."""
    cfg = exp.cfg
    # a deployment engine over-selects: it asks more clients and closes at the needed count
    fraction = over_selected(cfg.client_fraction, exp.engine.over_selection)
    if cfg.privacy.sampling == "poisson":  # DP-FedAvg: each client with probability C
        return sample_cohort(cfg.num_clients, fraction, cfg.seed, start, True, among)
    pool = list(range(cfg.num_clients)) if among is None else list(among)
    size = min(cohort_size(cfg.num_clients, fraction), len(pool))
    over = exp.systems.over_selection if exp.systems is not None else 0.0
    if over > 0:  # the virtual clock's over-selection: ceil((1 + f) K) asked
        size = min(math.ceil((1 + over) * cohort_size(cfg.num_clients, fraction)), len(pool))
    if size == 0:
        return []
    known = (history if history is not None else History()).view(exp.client_sizes())
    ask = SelectionRound(start, pool, size, known, cohort_rng(cfg.seed, start))
    return checked_choice(exp, ask)


def checked_choice(exp: Experiment, ask: SelectionRound) -> list[int]:
    """The run's policy's sorted choice for ``ask``, checked."""
    return _checked(exp, ask, exp.selection.select(ask))


def _checked(exp: Experiment, ask: SelectionRound, picked: list[int]) -> list[int]:
    """The policy's answer sorted, or one line saying why it cannot be a cohort."""
    try:
        ids = sorted(int(c) for c in picked)
    except (TypeError, ValueError):
        ids = []
    allowed = set(ask.among)
    if len(ids) == ask.size and len(set(ids)) == ask.size and allowed.issuperset(ids):
        return ids
    shown = picked if len(str(picked)) <= 200 else f"{str(picked)[:200]}..."
    raise ConfigError(
        f"selection.policy '{exp.cfg.selection.policy}' chose {shown} for round "
        f"{ask.round_idx + 1}: it must return {ask.size} distinct ids among the "
        f"{len(ask.among)} that may be asked"
    )


def live_pool(exp: Experiment, round_idx: int) -> tuple[list[int] | None, str | None]:
    """The clients a round may sample: every one in simulation (None); a
    deployment's engine names the ones whose process is there, waiting a while
    for ``robust.min_clients_of`` of them. Fewer: nobody, and why the round is skipped."""
    cfg = exp.cfg
    need = cfg.robust.min_clients_of(cohort_size(cfg.num_clients, cfg.client_fraction))
    pool = exp.engine.sampling_pool(round_idx, need)
    if pool is not None and len(pool) < need:
        return [], (
            f"only {len(pool)} client(s) connected, fewer than min_clients = {need} "
            "(deployment.live_wait_s)"
        )
    return pool, None
