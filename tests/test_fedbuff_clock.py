"""FedBuff in the simulator on everything the synchronous clock uses: each
server step's virtual time (``virtual_s``, the ``round_clock`` rows, the
summary's virtual seconds), availability when handing out work (only online
clients; a client offline before its upload arrives drops out), and each
arrived upload's seconds in the selection history (what Oort and
deadline_aware read). A hand-worked schedule on four clients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import MakeData
from tests.test_fedbuff import SIZES, _hand_cfg, _profiles

from fedforge.server.hooks import RoundEnd, RoundHook, RoundInfo
from fedforge.server.loop import run
from fedforge.store import RunStore


class Durations(RoundHook):
    """Each step's last_duration_s of every client (after the selection hook)."""

    name = "test_durations"

    def __init__(self) -> None:
        self.seen: list[dict[int, float | None]] = []

    def round_end(self, info: RoundInfo, end: RoundEnd) -> None:
        rows = info.state.selection.rows
        self.seen.append({c: rows.get(c, {}).get("last_duration_s") for c in range(4)})


def _trace(tmp_path: Path) -> str:
    """Client 0 and 3 always online; client 1 offline in [1.5, 3); client 2
    offline until 0.5 (the trace's period is 100 s)."""
    path = tmp_path / "trace.csv"
    rows = ["client_id,start_s,end_s", "0,0,100", "1,0,1.5", "1,3,100", "2,0.5,100", "3,0,100"]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def _run(tmp_path: Path, data: Any, trace: bool) -> tuple[Any, Durations]:
    systems = {"profiles": _profiles(tmp_path)}
    if trace:
        systems["trace"] = _trace(tmp_path)
    cfg = _hand_cfg(tmp_path, rounds=2, systems=systems)
    hook = Durations()
    return run(cfg, data=data, hooks=[hook]), hook


def test_steps_record_virtual_time_and_durations_without_offline(
    make_data: MakeData, tmp_path: Path
) -> None:
    """Always online (times 1, 2, 4, 5 s, M = 4, K = 2): step 0 ends at 2 with
    clients 0 and 1, step 1 at 4 with 0 (again, from step 1's model) and 1."""
    result, hook = _run(tmp_path, make_data(SIZES), trace=False)
    assert result.summary["virtual_seconds"] == 4.0
    with RunStore.open(result.run_dir) as store:
        clock = store.round_clock()
    assert clock == [(0, 0.0, 2.0, 2.0, 4, 2, 2), (1, 2.0, 2.0, 4.0, 4, 2, 2)]
    assert hook.seen[0] == {0: 1.0, 1: 2.0, 2: None, 3: None}


def test_only_online_clients_get_work_and_offline_ones_drop_out(
    make_data: MakeData, tmp_path: Path
) -> None:
    """With the trace: at t=0 clients 0, 1, 3 are online and handed work (2 is
    offline); 0 arrives at 1 and its slot goes to 2 (online since 0.5), arriving
    at 5; 1 goes offline at 1.5, before its upload at 2: it drops out. Step 0
    ends at 5 with 0 and 2 (2 before 3 at the tie). Step 1 takes 3 at 5, hands
    0, 1, 2 work at 5 and ends when 0 arrives at 6."""
    result, hook = _run(tmp_path, make_data(SIZES), trace=True)
    with RunStore.open(result.run_dir) as store:
        used = [sorted(c.client_id for c in store.client_rounds(r)) for r in range(2)]
        clock = store.round_clock()
        times = store.read_rows("client_times")
    assert used == [[0, 2], [0, 3]]
    # (round, start, duration, end, online at the start, heard from, arrived)
    assert clock == [(0, 0.0, 5.0, 5.0, 3, 3, 2), (1, 5.0, 1.0, 6.0, 4, 2, 2)]
    assert result.summary["virtual_seconds"] == 6.0
    dropped = [t for t in times if t[1] == 1]
    assert [(t[0], t[5], t[6]) for t in dropped] == [(0, 1.5, 0)]
    assert hook.seen[0] == {0: 1.0, 1: None, 2: 4.0, 3: None}
    assert hook.seen[1] == {0: 1.0, 1: None, 2: 4.0, 3: 5.0}


def test_with_nobody_online_the_clock_waits_for_the_first(
    make_data: MakeData, tmp_path: Path
) -> None:
    """Clients 0 and 1 come online at 2 s, 2 and 3 never: nothing is handed out
    until 2, then 0 and 1 arrive at 3 and 4: the step ends at 4."""
    trace = tmp_path / "late.csv"
    trace.write_text("client_id,start_s,end_s\n0,2,100\n1,2,100\n")
    systems = {"profiles": _profiles(tmp_path), "trace": str(trace)}
    result = run(_hand_cfg(tmp_path, rounds=1, systems=systems), data=make_data(SIZES))
    with RunStore.open(result.run_dir) as store:
        assert store.round_clock() == [(0, 0.0, 4.0, 4.0, 0, 2, 2)]
        assert sorted(c.client_id for c in store.client_rounds(0)) == [0, 1]
