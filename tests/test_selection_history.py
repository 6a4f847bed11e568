"""The selection history as columns: memory at a 100,000-client population, the
view a policy reads, and checkpoints (today's rows, and those written before)."""

from __future__ import annotations

import gc
import json
import math
import tracemalloc
from dataclasses import astuple

import numpy as np
import pytest

from fedforge.selection.history import NEVER, ClientHistory, History

N = 100_000
CALLS = 5  # call i asks clients i * 20,000 .. N - 1: client c in calls 0 .. c // 20,000


def _population_rounds(history: History) -> None:
    """Five upload rounds over 100,000 clients (``CALLS``): client c arrives
    unless c % 10 == 0; its update is taken with loss c / 1000 + i unless
    c % 7 == 0 (refused then); each arrived upload took c / 100 + i seconds."""
    for i in range(CALLS):
        asked = range(i * N // CALLS, N)
        arrived = [c for c in asked if c % 10]
        losses = {c: c / 1000 + i for c in arrived if c % 7}
        refused = [c for c in arrived if c % 7 == 0]
        durations = {c: c / 100 + i for c in arrived}
        history.round_done(10 * i, 10 * i + 1, asked, arrived, losses, refused, durations)


def _expected(c: int, n_k: int) -> ClientHistory:
    """Client ``c`` after :func:`_population_rounds`, worked out by hand."""
    last = c // (N // CALLS)  # the last call that asked it
    came, taken = c % 10 != 0, c % 10 != 0 and c % 7 != 0
    return ClientHistory(
        client_id=c,
        num_examples=n_k,
        asked=last + 1,
        last_asked=10 * last,
        used=last + 1 if taken else 0,
        last_used=10 * last + 1 if taken else None,
        last_loss=c / 1000 + last if taken else None,
        refused=last + 1 if came and not taken else 0,
        dropped=0 if came else last + 1,
        last_duration_s=c / 100 + last if came else None,
        first_asked=0,
    )


def test_a_100k_client_history_is_a_few_arrays_and_reads_as_worked_out() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        history = History()
        _population_rounds(history)
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 9 fields of 4 or 8 bytes: 4.2 MiB for 100,000 clients; a dict per client held 29
    assert retained < 16 * 2**20, f"{retained / 2**20:.1f} MiB retained"

    sizes = [c % 50 for c in range(N)]
    view = history.view(sizes)
    for c in [0, 1, 6, 7, 10, 14, 19_999, 20_000, 20_001, 59_990, 70_003, 99_999]:
        assert view[c] == _expected(c, sizes[c])
    # whole columns: None as NEVER (rounds) or NaN (seconds, losses)
    ids = np.arange(N)
    last = ids // (N // CALLS)
    taken = (ids % 10 != 0) & (ids % 7 != 0)
    assert np.array_equal(view.column("asked"), last + 1)
    assert np.array_equal(view.column("last_used"), np.where(taken, 10 * last + 1, NEVER))
    loss = view.column("last_loss")
    assert np.array_equal(np.isnan(loss), ~taken)
    assert np.array_equal(loss[taken], ids[taken] / 1000 + last[taken])
    assert np.array_equal(view.column("num_examples"), ids % 50)
    # a population larger than any id asked: the rest never heard of
    wider = history.view([1] * (N + 3))
    assert wider[N + 2] == ClientHistory(N + 2, 1)
    assert wider.column("first_asked")[N:].tolist() == [NEVER] * 3

    # a checkpoint's JSON round trip: every client the same
    back = History.from_state(json.loads(json.dumps(history.state_dict())))
    assert (
        back.column("last_duration_s", N).tobytes()
        == history.column("last_duration_s", N).tobytes()
    )
    for name in ("asked", "last_asked", "used", "last_used", "last_loss", "refused", "dropped"):
        assert np.array_equal(back.column(name, N), history.column(name, N), equal_nan=True)


def test_the_view_of_a_few_rounds_worked_out_by_hand() -> None:
    """Round 0 asks 0, 1, 2: 0 taken (loss 0.5, 4 s), 1 refused (6 s), 2 never
    arrives. Round 3 (period from 2) asks 0 and 5: 0 taken with a hidden loss
    (NaN) and an unmeasured time (inf), 5 arrives after 2.5 s, taken with 1.25."""
    h = History()
    h.round_done(0, 0, [0, 1, 2], [0, 1], {0: 0.5}, [1], {0: 4.0, 1: 6.0})
    h.round_done(2, 3, [0, 5], [0, 5], {0: math.nan, 5: 1.25}, [], {0: math.inf, 5: 2.5})
    view = h.view([10, 20, 30, 40, 50, 60])
    assert list(view.values()) == [
        ClientHistory(0, 10, 2, 2, 2, 3, 0.5, 0, 0, 4.0, 0),
        ClientHistory(1, 20, 1, 0, 0, None, None, 1, 0, 6.0, 0),
        ClientHistory(2, 30, 1, 0, 0, None, None, 0, 1, None, 0),
        ClientHistory(3, 40),
        ClientHistory(4, 50),
        ClientHistory(5, 60, 1, 2, 1, 3, 1.25, 0, 0, 2.5, 2),
    ]
    assert h.rows[2] == {"asked": 1, "last_asked": 0, "dropped": 1, "first_asked": 0}
    assert sorted(h.rows) == [0, 1, 2, 5]
    with pytest.raises(KeyError):
        view[6]
    # the checkpoint rows: [id, asked, last_asked, used, last_used, last_loss,
    # refused, dropped, last_duration_s, first_asked], None where never set
    assert h.state_dict() == [
        [0, 2, 2, 2, 3, 0.5, None, None, 4.0, 0],
        [1, 1, 0, None, None, None, 1, None, 6.0, 0],
        [2, 1, 0, None, None, None, None, 1, None, 0],
        [5, 1, 2, 1, 3, 1.25, None, None, 2.5, 2],
    ]
    with pytest.raises(ValueError, match="client id -1 is negative"):
        h.round_done(4, 4, [-1], [], {}, [])


def test_rows_written_before_load_to_the_same_view_and_are_written_back_alike() -> None:
    """Rows as checkpoints have always held them (client 9's from before the
    duration and first-asked columns existed: two fields short)."""
    stored = [
        [0, 3, 7, None, None, None, None, 3, None, 1],
        [4, 1, 7, 1, 8, 0.125, 2, None, 12.75, 7],
        [9, 2, 5, 2, 6, 2.5, None, None],
    ]
    h = History.from_state(json.loads(json.dumps(stored)))
    view = h.view([1] * 10)
    assert [astuple(view[c]) for c in (0, 4, 9, 3)] == [
        (0, 1, 3, 7, 0, None, None, 0, 3, None, 1),
        (4, 1, 1, 7, 1, 8, 0.125, 2, 0, 12.75, 7),
        (9, 1, 2, 5, 2, 6, 2.5, 0, 0, None, None),
        (3, 1, 0, None, 0, None, None, 0, 0, None, None),
    ]
    assert h.state_dict() == [stored[0], stored[1], [*stored[2], None, None]]
    assert History.from_state(None).state_dict() == History.from_state([]).state_dict() == []
