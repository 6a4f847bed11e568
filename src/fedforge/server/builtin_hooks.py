"""The package's own round hooks (``server/hooks.py`` says when each is called):
privacy, diagnostics, the commit of client state, the selection history and the
alerts, in every run's list before the user's (a deployment's rollout, a gate,
is handed in by ``fedforge server``)."""

from __future__ import annotations

from collections.abc import Sequence

from fedforge.alerts import Monitor
from fedforge.server import diagnostics
from fedforge.server.hooks import RoundEnd, RoundGate, RoundHook, RoundHooks, RoundInfo


class PrivacyHook(RoundHook):
    """Adaptive clipping's clip norm (published at the round's start, the next one
    from the clients the model took at its end) and the round's participation,
    what the accountant counts. Its state is ``LoopState.privacy``."""

    name = "privacy"

    def round_start(self, info: RoundInfo) -> None:
        parts = info.exp.privacy
        if parts is not None and info.kind == "upload":
            parts.begin_round(info.state.privacy, info.round_idx)

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        parts = info.exp.privacy
        if parts is None or info.kind == "local":  # nothing travelled: nothing released
            return
        if end.applied:
            parts.end_round(info.state.privacy, info.round_idx, end.used)
        seen = bool(end.arrived)  # no upload arrived: no noise drawn, nothing seen
        parts.record_participation(info.state.privacy, info.round_idx, info.start, seen, end.seen)


class DiagnosticsHook(RoundHook):
    """The drift figures of the updates a round took (server/diagnostics.py): set
    up before the clients train, their rows and the drift warning at the round's
    end. Its streak is ``LoopState.diagnostics``."""

    name = "diagnostics"

    def round_start(self, info: RoundInfo) -> None:
        if info.kind != "upload":
            return
        exp = info.exp
        secure = exp.privacy is not None and exp.privacy.secagg is not None
        info.diagnostics = diagnostics.start_round(exp, info.trainers, info.params, secure)

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        state = info.state
        diagnostics.end_round(
            info.exp, info.diagnostics, state.diagnostics, state.outputs, info.bar, info.round_idx
        )


class ClientStateHook(RoundHook):
    """Keeps the per-client state computed in a round (SCAFFOLD's c_k+) for the
    clients whose updates the model took; the others' is forgotten (the server
    never saw their change). The state itself is in the algorithm's tables."""

    name = "client_state"

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        terms = info.exp.algorithm.client
        if terms is not None and info.kind == "upload":
            terms.commit(end.used)


class SelectionHook(RoundHook):
    """What the server learns of the clients an upload round asked (which uploads
    arrived, were taken with what training loss, were refused, how long each
    arrived one took: the round's ``client_times`` rows, a deployment's measured
    seconds): the selection policy's input for the next cohorts. Its state is
    ``LoopState.selection``; each round's cohort goes to the run store
    (``cohorts``: the participation report's)."""

    name = "selection"

    def __init__(self) -> None:
        self.refused: list[int] = []  # the round's refused uploads so far

    def round_start(self, info: RoundInfo) -> None:
        self.refused = []

    def upload(self, info: RoundInfo, client_id: int, taken: bool, reason: str | None) -> None:
        if not taken:
            self.refused.append(client_id)

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        if info.kind != "upload":  # nothing was asked of the clients yet
            return
        losses = {c.client_id: c.train_loss for c in end.clients}
        times = info.state.outputs.get("client_times", [])
        # (round, client, download, compute, upload, total, arrived); NULL total: NaN
        measured = {int(t[1]): float(t[5]) for t in times if t[6] and t[5] is not None}
        cohort = [(info.round_idx, c, info.start) for c in sorted(info.cohort)]
        info.state.outputs["cohorts"] = cohort  # the run store's record of who was asked
        info.state.selection.round_done(
            info.start,
            info.round_idx,
            info.cohort,
            end.arrived,
            losses,
            self.refused,
            {**measured, **end.durations},
        )


class AlertsHook(RoundHook):
    """The config's alert rules (``alerts.rules``) on each round as the run store
    recorded it (alerts/monitor.py): the rules stepped, each firing's actions run
    (they never stop the run), the ``alerts`` rows written, a line on the progress
    bar. Its state is rebuilt from the store (a resumed run fires where the
    uninterrupted one would): nothing to checkpoint."""

    name = "alerts"

    def __init__(self) -> None:
        self.monitor: Monitor | None = None  # made at the first recorded round

    def recorded(self, info: RoundInfo) -> None:
        if info.store is None:
            return
        if self.monitor is None:
            self.monitor = Monitor(info.exp.cfg, info.bar.write)
        self.monitor.after_round(info.store, info.round_idx)


def run_hooks(user: Sequence[RoundHook] = (), gates: Sequence[RoundGate] = ()) -> RoundHooks:
    """A run's hooks in their documented order: privacy, diagnostics, client state,
    selection, ``gates`` (the package's own acting hooks: a deployment's rollout),
    alerts (each does nothing where its feature is off), then the user's, which
    are never gates."""
    own = [PrivacyHook(), DiagnosticsHook(), ClientStateHook(), SelectionHook()]
    return RoundHooks([*own, *gates, AlertsHook(), *user], gates)
