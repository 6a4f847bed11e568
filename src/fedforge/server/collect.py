"""The simulator's side of collection: it plays the network between a
collector and the engine, with function calls.

Each phase the collector asks for goes out through the engine: protocol
messages by ``Engine.run_phase`` (replies back to ``Collector.reply``), the
payload to the clients that train by ``Engine.run_cohort`` (uploads back to
``Collector.offer``, in the order they finish; each uploader is told the
verdict, at once or, when the collector ``holds`` its uploads, at the round's
end). Simulated dropouts of secure
aggregation (``privacy.secagg_drop_<phase>``) are drawn here, from (seed,
round, phase), and reported to the collector before the phase reaches them; a
deployment server reports the clients that really went silent instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from fedforge.client.runtime import ClientTask, ClientUpload
from fedforge.config.privacy import secagg_drops
from fedforge.core.rng import numpy_rng
from fedforge.server.collectors import Collected, Collector
from fedforge.server.experiment import Experiment

# the uploads as the engine yields them, and the round's collector -> those that arrive
Arrivals = Callable[[Iterable[ClientUpload], Collector], Iterable[ClientUpload]]


def dropped(seed: int, round_idx: int, phase: str, fraction: float, alive: list[int]) -> set[int]:
    """The simulated dropouts before ``phase``: round(fraction * alive) clients."""
    n = int(round(fraction * len(alive)))
    if n == 0:
        return set()
    pick = numpy_rng(seed, "secagg_drop", round_idx, phase).choice(len(alive), n, replace=False)
    return {alive[i] for i in pick.tolist()}


def collect(
    exp: Experiment,
    collector: Collector,
    tasks: Sequence[ClientTask],
    payload: bytes,
    round_idx: int,
    arrivals: Arrivals | None = None,
    askable: set[int] | None = None,
) -> Collected:
    """Run ``collector``'s phases to the end against the engine, asking only the
    ``askable`` clients (None: all; the round's gates, server/hooks.py): the
    others get no message and no task, and count as dropouts. ``arrivals`` (the
    virtual clock's, server/virtual_clock.py) reorders the uploads as they would
    arrive and reports the late ones to the collector as dropouts."""
    drops = secagg_drops(exp.cfg.privacy) if exp.privacy and exp.privacy.secagg else {}
    arrived: set[int] = set()
    held: list[ClientUpload] = []  # taken, judged again at the end (``Collector.holds``)
    try:
        while (upcoming := collector.upcoming()) is not None:
            name, addressed = upcoming
            for c in sorted(
                dropped(exp.cfg.seed, round_idx, name, drops.get(name, 0.0), addressed)
            ):
                collector.dropout(c)
            phase = collector.next_phase()
            if phase is None:
                break
            messages = phase.messages
            if askable is not None:
                messages = {c: m for c, m in messages.items() if c in askable}
            if messages:
                for c, data in exp.engine.run_phase(phase.name, messages).items():
                    collector.reply(c, data)
            train = set(phase.train) if askable is None else askable.intersection(phase.train)
            trainers = [t for t in tasks if t.client_id in train]
            summing = collector.summing() if arrivals is None and trainers else None
            shares = None if summing is None else exp.engine.run_summed(trainers, payload, summing)
            if shares is not None:  # each worker's uploads judged and summed where trained
                for share in shares:
                    arrived.update(collector.take_share(share))
                collector.end_phase()
                continue
            uploads: Iterable[ClientUpload] = (
                exp.engine.run_cohort(trainers, payload) if trainers else ()
            )
            if arrivals is not None:
                uploads = arrivals(uploads, collector)
            for upload in uploads:
                arrived.add(upload.client_id)
                why = collector.offer(upload.client_id, upload.data)
                if why is None and collector.holds:
                    held.append(upload)
                elif upload.settle is not None:
                    upload.settle(why)
            collector.end_phase()
        collected = collector.finish()
    except BaseException:
        for up in held:
            _settle(
                up, f"round {round_idx + 1} stopped before it judged client {up.client_id}'s update"
            )
        raise
    for up in held:
        _settle(up, collected.refused_at_end.get(up.client_id))
    return dataclasses.replace(collected, arrived=frozenset(arrived))


def _settle(upload: ClientUpload, why: str | None) -> None:
    """Tell ``upload``'s uploader the round's verdict (a deployment's; none in simulation)."""
    if upload.settle is not None:
        upload.settle(why)
