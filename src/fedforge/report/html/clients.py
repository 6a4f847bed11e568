"""The per-client figures of a report, read from the run store and summarised so
that a run of many clients and rounds stays a small page: the accuracy
distribution of the last evaluated round, its percentiles by round, accuracy
per group of clients, participation, update norms and cosine, refused uploads.

Per-client values are embedded one per client up to ``PER_CLIENT`` clients;
beyond that as a histogram (``bins``: edges and counts). Refusals are counted by
reason and by client (the most frequent ``TOP`` of each; the rest summed).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedforge.evaluation.clients import summarize_accuracies
from fedforge.evaluation.participation import lorenz
from fedforge.evaluation.participation import participation as participation_figures
from fedforge.report.html.gather import VIRTUAL_TIME, Data, finite
from fedforge.report.reasons import SHOWN_KINDS, reason_kind
from fedforge.store.runstore import RunStore

PER_CLIENT = 5000  # clients embedded one by one; more are binned
BINS = 50
TOP = SHOWN_KINDS  # reasons, clients and groups shown by name (the dashboard's too)
GROUP_COLUMNS = ("round", "accuracy", "loss", "num_examples", "clients")


def histogram(values: Sequence[float], bins: int = BINS) -> Data:
    """``values`` binned: ``bins + 1`` edges and the counts between them."""
    counts, edges = np.histogram(np.asarray(values, dtype=np.float64), bins=bins)
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def _per_client(ids: list[int], values: Sequence[float], key: str) -> Data:
    """One value per client, or their histogram past ``PER_CLIENT`` clients."""
    if len(ids) <= PER_CLIENT:
        return {"client_id": ids, key: values, "bins": None}
    return {"client_id": None, key: None, "bins": histogram(values)}


def client_accuracy(store: RunStore, participation: dict[int, int]) -> Data:
    """Per-client evaluation (``client_eval``): the last evaluated round's
    distribution, its summary and worst clients (with the rounds each one's
    update was aggregated in), and the mean, 10th percentile and minimum of
    every evaluated round."""
    rows = store.read_rows("client_eval")  # (round, client, accuracy, loss, examples)
    if not rows:
        return {"round": None}
    by_round: dict[int, list[float]] = {}
    for r, _, acc, _, _ in rows:
        if acc is not None:
            by_round.setdefault(r, []).append(float(acc))
    last = max(r for r, *_ in rows)
    kept = [row for row in rows if row[0] == last and row[2] is not None]
    accs = {int(c): float(a) for _, c, a, _, _ in kept}
    detail = {int(c): (loss, int(n)) for _, c, _, loss, n in kept}
    summary = summarize_accuracies(accs)
    ids = sorted(accs)
    evaluated = sorted(by_round)
    return finite(
        {
            "round": last + 1,
            **_per_client(ids, [accs[c] for c in ids], "accuracy"),
            "summary": {
                "clients": summary.clients,
                "mean": summary.mean,
                "std": summary.std,
                "p10": summary.p10,
                "jain": summary.jain,
                "variance": summary.variance,
            },
            "worst": [
                {
                    "client_id": c,
                    "accuracy": a,
                    "loss": detail[c][0],
                    "num_examples": detail[c][1],
                    "rounds_aggregated": participation.get(c, 0),
                }
                for c, a in summary.worst
            ],
            "over_rounds": {
                "round": [r + 1 for r in evaluated],
                "mean": [float(np.mean(by_round[r])) for r in evaluated],
                "p10": [float(np.percentile(by_round[r], 10)) for r in evaluated],
                "min": [min(by_round[r]) for r in evaluated],
            },
        }
    )


def groups(store: RunStore) -> Data:
    """Accuracy per group of clients by round, one entry per attribute
    (``group_eval``); an attribute of many groups keeps the ``TOP`` with the most
    clients in its last round and says how many it left out."""
    series: dict[str, dict[str, dict[str, list[Any]]]] = {}
    for r, attribute, group, acc, loss, examples, clients in store.group_rows():
        s = series.setdefault(attribute, {}).setdefault(group, {k: [] for k in GROUP_COLUMNS})
        for key, value in zip(GROUP_COLUMNS, (r + 1, acc, loss, examples, clients), strict=True):
            s[key].append(value)
    attributes = {}
    for attribute, by_group in series.items():
        order = sorted(by_group, key=lambda g: (-(by_group[g]["clients"][-1] or 0), g))
        attributes[attribute] = {
            "groups": {g: by_group[g] for g in order[:TOP]},
            "left_out": len(order[TOP:]),
        }
    return finite({"attributes": attributes})


def participation(store: RunStore, counts: dict[int, int], num_clients: int) -> Data:
    """In how many rounds each client's update was aggregated (``client_rounds``:
    refused uploads and skipped rounds are not there), how many of the run's
    clients never had one aggregated; and how the cohorts spread (``cohorts``:
    the clients each round asked): Jain's index and Gini of the rounds asked,
    the never asked, the wait for a first cohort (in virtual seconds too where
    the rounds have a ``virtual_time`` column, the clock at each round's end),
    the Lorenz curves. A store without ``cohorts`` (an older run) counts the
    rounds aggregated in their place (``asked_recorded`` False)."""
    ids = sorted(counts)
    values = [counts[c] for c in ids]
    cohorts = store.read_rows("cohorts")  # (round, client, drawn round)
    asked: Counter[int] = Counter(c for _, c, _ in cohorts)
    first: dict[int, int] = {}
    for _, c, drawn in cohorts:
        first[c] = min(first.get(c, drawn), drawn)
    if not cohorts:  # an older store: the rounds aggregated stand in
        asked = Counter(counts)
        for row in store.client_rounds():
            first.setdefault(row.client_id, row.round_idx)  # in round order
    virtual = store.round_column(VIRTUAL_TIME)
    ends = {r: float(v) for r, v in virtual or [] if v is not None}
    stats = participation_figures(num_clients, asked, counts, first, ends or None)
    every = [asked.get(c, 0) for c in range(num_clients)]
    return finite(
        {
            **_per_client(ids, values, "rounds"),
            "clients_seen": len(ids),
            "num_clients": num_clients,
            "never": max(num_clients - len(ids), 0),
            "min": min(values, default=None),
            "median": statistics.median(values) if values else None,
            "max": max(values, default=None),
            "asked_recorded": bool(cohorts),
            "stats": stats,
            "asked": every if num_clients <= PER_CLIENT else None,
            "asked_bins": None if num_clients <= PER_CLIENT else histogram(every),
            "lorenz_asked": lorenz(every),
            "lorenz_used": lorenz([counts.get(c, 0) for c in range(num_clients)]),
        }
    )


def updates(store: RunStore) -> Data:
    """Each round's update norms (median, max) and mean pairwise cosine, from the
    ``diagnostics`` table; without it the norms from ``client_rounds`` (no cosine);
    with a sparsifying uplink, the overlap of the uploads' index sets."""
    diag = store.read_rows("diagnostics")  # (round, clients, cosine, median, max, ratio)
    overlap = index_overlap(store)
    if diag:
        return finite(
            {
                "source": "diagnostics",
                "round": [d[0] + 1 for d in diag],
                "mean_cosine": [d[2] for d in diag],
                "norm_median": [d[3] for d in diag],
                "norm_max": [d[4] for d in diag],
                "overlap": overlap,
            }
        )
    norms = store.update_norms()
    if not norms:
        return {"source": None, "overlap": overlap}
    ordered = sorted(norms)
    return finite(
        {
            "source": "client_rounds",
            "round": [r + 1 for r in ordered],
            "mean_cosine": None,
            "norm_median": [statistics.median(norms[r]) for r in ordered],
            "norm_max": [max(norms[r]) for r in ordered],
            "overlap": overlap,
        }
    )


def index_overlap(store: RunStore) -> Data | None:
    """Each round's overlap of the uploads' index sets (server/index_overlap.py),
    None when the run recorded none (a dense uplink)."""
    rows = store.read_rows("index_overlap")
    if not rows:
        return None
    columns = ("clients", "kept_mean", "pair_overlap", "chance", "union", "common")
    out: Data = {"round": [r[0] + 1 for r in rows]}
    out.update({name: [r[i + 1] for r in rows] for i, name in enumerate(columns)})
    return finite(out)


def _top(counter: Counter[Any], key: str) -> Data:
    top = counter.most_common(TOP)
    return {
        key: [k for k, _ in top],
        "count": [n for _, n in top],
        "others": sum(counter.values()) - sum(n for _, n in top),
        "distinct": len(counter),
    }


def refused(store: RunStore) -> Data:
    """Refused uploads (``anomalies`` rows with a client) by reason, by client and
    by round; skipped rounds (rows without a client) with their reasons."""
    rows = store.anomalies()
    uploads = [a for a in rows if a.client_id is not None]
    skipped = [a for a in rows if a.client_id is None]
    per_round = Counter(a.round_idx + 1 for a in uploads)
    return {
        "refused": len(uploads),
        "clients": len({a.client_id for a in uploads}),
        "by_reason": _top(Counter(reason_kind(a.reason) for a in uploads), "reason"),
        "by_client": _top(Counter(a.client_id for a in uploads), "client_id"),
        "per_round": {
            "round": sorted(per_round),
            "count": [per_round[r] for r in sorted(per_round)],
        },
        "skipped": {
            "round": [a.round_idx + 1 for a in skipped],
            "reason": [a.reason for a in skipped],
        },
    }
