"""The sections of one run's report page (``run_report.py`` assembles them): each
turns its part of the gathered data into HTML, or a sentence saying the run has
no data for it."""

from __future__ import annotations

import html
import json

from fedforge.report.html import figures
from fedforge.report.html.gather import Data
from fedforge.report.html.page import Section, pre, table, text
from fedforge.report.progress import format_bytes, format_duration, percent
from fedforge.report.reasons import others_row
from fedforge.systems.summary import population_rows

LISTED = 20  # skipped rounds listed by name


def num(value: float | None, spec: str = ".4g") -> str:
    """A figure as text, ``-`` for none."""
    return "-" if value is None else format(value, spec)


def _progress(d: Data) -> Section:
    s = Section("progress", "Accuracy and loss", d, figures=figures.progress_figures(d))
    if not d["round"]:
        s.empty = "The run has recorded no round yet."
    elif not any(v is not None for v in d["test_accuracy"]):
        s.body = text("No round was evaluated on the test set; the train loss is drawn alone.")
    return s


def _time(d: Data) -> Section:
    s = Section("time", "Time", d, figures=figures.time_figures(d))
    if not d["round"]:
        s.empty = "The run has recorded no round yet."
    elif d["virtual_time"] is None:
        s.body = text("The rounds table has no virtual_time column: wall time only.")
    else:
        to_target = d["virtual_seconds_to_target"]
        said = "" if to_target is None else f"; {format_duration(to_target)} to the target"
        s.body = text(f"Virtual time: {format_duration(d['virtual_time'][-1])} in all{said}.")
    population = d["population"]
    if population is not None:  # the system profiles' quantiles
        clients = html.escape(str(population["clients"]))
        title = f"<h3>Population: {clients} clients' system profiles</h3>"
        rows = population_rows(population)
        s.body = (s.body or "") + title + table(["figure", "unit", "p10", "p50", "p90"], rows, 2)
    return s


def _clients(d: Data) -> Section:
    s = Section("clients", "Per-client accuracy", d, figures=figures.client_figures(d))
    if d["round"] is None:
        s.empty = "The run evaluated no client on its own data (evaluation.clients was off)."
        return s
    summary = d["summary"]
    s.body = text(
        f"Round {d['round']}: {summary['clients']} clients, mean {num(summary['mean'])}, "
        f"std {num(summary['std'])}, 10th percentile {num(summary['p10'])}, "
        f"Jain's index {num(summary['jain'])}."
    ) + table(
        ["worst clients", "accuracy", "loss", "examples", "rounds aggregated"],
        [
            (
                w["client_id"],
                percent(w["accuracy"]),
                num(w["loss"]),
                w["num_examples"],
                w["rounds_aggregated"],
            )
            for w in d["worst"]
        ],
    )
    return s


def _groups(d: Data) -> Section:
    s = Section("groups", "Per-group accuracy", d, figures=figures.group_figures(d))
    if not d["attributes"]:
        s.empty = "The run has no per-group evaluation (no group_eval table)."
        return s
    left = [f"{a}: {e['left_out']}" for a, e in d["attributes"].items() if e["left_out"]]
    if left:
        s.body = text("Groups left out (the largest are drawn): " + ", ".join(left) + ".")
    return s


def _participation(d: Data) -> Section:
    s = Section("participation", "Participation", d, figures=figures.participation_figures(d))
    if not d["clients_seen"] and not d["asked_recorded"]:
        s.empty = "No client's update has been aggregated in a recorded round."
        return s
    p = d["stats"]
    asked = "rounds asked" if d["asked_recorded"] else "rounds aggregated (no cohorts recorded)"
    wait = ""
    if p["first_asked_median_rounds"] is not None:
        wait = (
            f" A client waited {num(p['first_asked_median_rounds'])} rounds (median) for its "
            f"first cohort, {p['first_asked_max_rounds']} at most"
        )
        if p["first_asked_median_s"] is not None:
            wait += (
                f"; {num(p['first_asked_median_s'])} s of virtual time (median), "
                f"{num(p['first_asked_max_s'])} s at most"
            )
        wait += "."
    never = f" Never asked: {p['never_asked_ids']}." if p["never_asked"] else ""
    s.body = text(
        f"{d['clients_seen']} of {d['num_clients']} clients had an update aggregated in at "
        f"least one round ({d['never']} never; a refused upload does not count); rounds "
        f"aggregated per client: min {d['min']}, median {d['median']}, max {d['max']}."
    ) + text(
        f"Over the {asked}: Jain's index {num(p['jain_asked'], '.3f')}, Gini "
        f"{num(p['gini_asked'], '.3f')}; over the rounds aggregated: Jain "
        f"{num(p['jain_used'], '.3f')}, Gini {num(p['gini_used'], '.3f')}; "
        f"{p['never_asked']} of {p['num_clients']} clients never asked.{wait}{never}"
    )
    return s


def _updates(d: Data) -> Section:
    s = Section("updates", "Update norms and cosine", d, figures=figures.update_figures(d))
    said = _overlap(d.get("overlap"))
    if d["source"] is None and not said:
        s.empty = "The run recorded no update norms."
    elif d["source"] == "client_rounds":
        said = text("No diagnostics table: norms from the clients' rows, no cosine.") + said
    s.body = said
    return s


def _overlap(d: Data | None) -> str:
    """The last round's overlap of the uploads' index sets, in a sentence."""
    if d is None:
        return ""
    r = next((i for i in reversed(range(len(d["round"]))) if d["pair_overlap"][i] is not None), -1)
    if r < 0:  # else the last round with a figure
        return text("Index overlap: no round took two sparsified uploads.")
    return text(
        f"Index overlap, round {d['round'][r]}: {d['clients'][r]} uploads of "
        f"{num(d['kept_mean'][r], '.6g')} coordinates each (mean); a pair of them shares "
        f"{num(d['pair_overlap'][r], '.3f')} of their coordinates (sets drawn at random: "
        f"{num(d['chance'][r], '.3f')}; a Jaccard index of o / (2 - o) for overlap o); "
        f"{num(d['union'][r], '.3%')} of the model's coordinates kept by at least one, "
        f"{num(d['common'][r], '.3%')} by all."
    )


def _refused(d: Data) -> Section:
    s = Section("refused", "Refused uploads", d, figures=figures.refused_figures(d))
    skipped = d["skipped"]
    if not d["refused"] and not skipped["round"]:
        s.empty = "No upload was refused and no round skipped."
        return s
    parts = [
        text(
            f"{d['refused']} uploads refused from {d['clients']} clients; "
            f"{len(skipped['round'])} rounds skipped. Reasons are grouped with their numbers as #."
        )
    ]
    reasons = d["by_reason"]
    if reasons["reason"]:
        rows = list(zip(reasons["reason"], reasons["count"], strict=True))
        if reasons["others"]:
            rows.append(others_row(reasons["distinct"] - len(rows), reasons["others"]))
        parts.append(table(["reason", "uploads"], rows, text_columns=1))
    if skipped["round"]:
        rows = list(zip(skipped["round"], skipped["reason"], strict=True))
        if len(rows) > LISTED:
            rows = [*rows[:LISTED], ("...", f"{len(rows) - LISTED} more")]
        parts.append(table(["skipped round", "reason"], rows, text_columns=2))
    s.body = "".join(parts)
    return s


def _alerts(d: Data) -> Section:
    s = Section("alerts", "Alerts", d)
    if not d["round"]:
        watched = "" if d["rules"] is None else f" ({d['rules']} rules watched)"
        s.empty = f"No alerts fired{watched}."
        return s
    fired = len(d["round"])
    s.body = text(f"{fired} alert{'' if fired == 1 else 's'} fired.") + table(
        ["round", "rule", "kind", "message", "outcome"],
        list(zip(d["round"], d["rule"], d["kind"], d["message"], d["outcome"], strict=True)),
        text_columns=5,
    )
    return s


def _privacy(d: Data) -> Section:
    s = Section("privacy", "Privacy", d, figures=figures.privacy_figures(d))
    if not d["round"]:
        s.empty = f"The run recorded no privacy spent (privacy.dp: {d['dp']})."
        return s
    budget = "no budget" if d["budget"] is None else f"budget {d['budget']}"
    s.body = text(f"DP {d['dp']}, epsilon at delta {num(d['delta'][-1], '.3g')}, {budget}.")
    return s


def _bytes(d: Data) -> Section:
    s = Section("bytes", "Bytes and compression", d, figures=figures.bytes_figures(d))
    if not d["round"]:
        s.empty = "The run has recorded no round yet."
        return s
    up, down = d["overall_ratio_up"], d["overall_ratio_down"]
    ratio = (
        f"float32 bytes over bytes sent: up {num(up, '.3f')}, down {num(down, '.3f')}."
        if up is not None or down is not None
        else "The run's rounds did not record their float32 bytes: no compression ratio."
    )
    s.body = text(
        f"Up {format_bytes(d['total_up'])}, down {format_bytes(d['total_down'])}. {ratio}"
    )
    return s


def _versions(d: Data) -> Section:
    s = Section("versions", "Model versions", d)
    rows = d["versions"]
    if not rows:
        s.empty = "The run stored no model versions (only a deployment does)."
        return s
    s.body = table(
        ["version", "parent", "round", "created", "status", "metrics"],
        [
            (
                v["version_id"],
                v["parent_id"],
                v["round"],
                v["created"],
                v["status"],
                ", ".join(f"{k} {num(x)}" for k, x in v["metrics"].items()),
            )
            for v in rows
        ],
        text_columns=0,
    )
    return s


def _fields(record: Data | None, missing: str) -> str:
    """A JSON object as a two-column table of its fields, or ``missing``."""
    if not record:
        return text(missing)
    rows = [
        (k, json.dumps(v) if isinstance(v, dict | list) else v) for k, v in sorted(record.items())
    ]
    return table(["field", "value"], rows, text_columns=2)


def _setup(d: Data) -> Section:
    s = Section("setup", "Config, summary and build", d)
    build = d["build"] or {}
    written = ", ".join(f"{k} {v}" for k, v in d["report_written_by"].items() if v)
    recorded = any(k in build for k in ("versions", "environment"))
    note = "" if recorded else "The run recorded no software versions or environment; "
    s.body = "".join(
        [
            "<h3>Config</h3>",
            text(d["config_note"]) if d["config_note"] else "",
            pre(d["config_yaml"]),
            "<h3>Build record</h3>",
            _fields(build, "The run has no build record (build.json)."),
            text(f"{note}this report was written with {written}."),
            "<h3>Summary</h3>",
            _fields(d["summary"], "The run has no summary yet (unfinished)."),
        ]
    )
    return s


# each section of the page, in order, and what builds it from its data
BUILDERS = {
    "progress": _progress,
    "time": _time,
    "clients": _clients,
    "groups": _groups,
    "participation": _participation,
    "updates": _updates,
    "refused": _refused,
    "alerts": _alerts,
    "privacy": _privacy,
    "bytes": _bytes,
    "versions": _versions,
    "setup": _setup,
}


__all__ = ["BUILDERS", "LISTED", "num"]
