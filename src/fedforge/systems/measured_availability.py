"""Each client's availability from a deployment's record of who was there
(the run store's ``presence`` rows, ``store/presence.py``): the mean online
and offline spells of the profile's two-state model (``profile.py``).

Within each watch of a server process, a client is followed from its first
spell on (before it, the server cannot tell a device that is off from one
still finding a server that just started). Per client, over all watches:

- seconds online: each row's length less the offline gaps merged into it;
- departures: the spells seen to end with the client leaving;
- seconds offline: the gaps between its spells, and from its last departure to
  the watch's end;
- returns: the spells that began after a departure.

The sojourns of a two-state Markov process are exponential, whose mean's
maximum-likelihood estimate, with spells cut short by the watch's end, is the
time spent in the state over the spells seen to end: ``mean_online_s`` =
seconds online / departures (none: always online), ``mean_offline_s`` =
seconds offline / returns. A client that left and never came back has no
offline spell seen to end: its one offline spell is taken as long as it was
seen (a lower bound), said in a note.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from fedforge.core.ids import format_ids

AVAILABILITY_NOTE = (
    "availability is not in the run's records: every client is always online (mean_offline_s 0)"
)


@dataclass
class Followed:
    """One client's totals over the watches."""

    online_s: float = 0.0
    offline_s: float = 0.0
    departures: int = 0
    returns: int = 0

    def means(self) -> tuple[float, float]:
        """(mean_online_s, mean_offline_s); (inf, 0): always online."""
        if self.departures == 0 or self.offline_s <= 0:
            return math.inf, 0.0
        return self.online_s / self.departures, self.offline_s / max(self.returns, 1)


def follow(
    spells: Sequence[tuple[int, float, float, int, int, float]],
    watches: Sequence[tuple[float, float]],
) -> dict[int, Followed]:
    """Each client's totals from ``spells`` rows (client, since, until, left,
    gaps, gap_s) and the ``watches`` (since, until) they were seen in."""
    out: dict[int, Followed] = {}
    by_client: dict[int, list[tuple[int, float, float, int, int, float]]] = {}
    for r in sorted(spells):
        by_client.setdefault(r[0], []).append(r)
    for c, rows in by_client.items():
        for w_since, w_until in watches:
            mine = [r for r in rows if w_since <= r[1] <= w_until]
            if not mine:
                continue
            f = out.setdefault(c, Followed())
            for i, (_, since, until, left, gaps, gap_s) in enumerate(mine):
                f.online_s += max(0.0, until - since - gap_s)
                f.offline_s += gap_s
                f.departures += gaps + left
                f.returns += gaps + (1 if i > 0 else 0)
                if left:
                    end = mine[i + 1][1] if i + 1 < len(mine) else max(w_until, until)
                    f.offline_s += max(0.0, end - until)
    return out


def availability(
    spells: Sequence[tuple[int, float, float, int, int, float]],
    watches: Sequence[tuple[float, float]] | None,
    num_clients: int,
) -> tuple[list[tuple[float, float]], list[str]]:
    """Each client's (mean_online_s, mean_offline_s), ids 0..``num_clients``-1,
    and the notes on what was not measured. ``watches`` None: the run has no
    record (every client always online, said in a note)."""
    if watches is None:
        return [(math.inf, 0.0)] * num_clients, [AVAILABILITY_NOTE]
    followed = {c: f for c, f in follow(spells, watches).items() if 0 <= c < num_clients}
    own = {c: f.means() for c, f in followed.items()}
    notes = []
    never_back = [c for c, f in followed.items() if f.departures and not f.returns]
    if never_back:
        notes.append(
            f"clients {format_ids(never_back, most=10, sep=', ')}: left and never came back "
            "while the server watched; mean_offline_s is the one offline spell as long as it "
            "was seen (a lower bound)"
        )
    lacking = [c for c in range(num_clients) if c not in own]
    if lacking and own:
        online = statistics.median(m[0] for m in own.values())
        offline = statistics.median(m[1] for m in own.values())
        own.update({c: (online, offline) for c in lacking})
        notes.append(
            f"clients {format_ids(lacking, most=10, sep=', ')}: never connected while the "
            f"server watched; their availability is the connected clients' median "
            f"(mean_online_s {online:.6g}, mean_offline_s {offline:.6g})"
        )
    elif lacking:
        own.update({c: (math.inf, 0.0) for c in lacking})
        notes.append("no client connected while the server watched: every client always online")
    return [own[c] for c in range(num_clients)], notes


__all__ = ["AVAILABILITY_NOTE", "Followed", "availability", "follow"]
