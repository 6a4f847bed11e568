"""``fedforge report RUN``: one run's store as a self-contained HTML page.

Sections, in order, each present whether or not the run has data for it (a
sentence says when it has none): accuracy and loss, time, per-client accuracy,
per-group accuracy, participation, update norms and cosine, refused uploads,
alerts fired, privacy, bytes and compression, model versions, setup (config,
summary, build record). A config this fedforge cannot rebuild (a newer
version's) is shown as stored, its settings read by name, with a sentence
saying so. The sections themselves are ``sections.py``'s.
"""

from __future__ import annotations

from pathlib import Path

from fedforge.core.errors import StoreError
from fedforge.report.facts import EARLY_STOPS
from fedforge.report.html import clients, gather
from fedforge.report.html.gather import Data
from fedforge.report.html.page import Section, render, table
from fedforge.report.html.sections import BUILDERS, num
from fedforge.report.progress import format_bytes, format_duration, named_score
from fedforge.report.shown_config import shown_config
from fedforge.store.disk import os_error_text
from fedforge.store.runstore import RunStore


def gather_run(store: RunStore) -> tuple[Data, dict[str, Data]]:
    """The run's identity and every section's data."""
    cfg, rounds = shown_config(store), store.rounds()
    counts = store.participation()
    num_clients = cfg.get("num_clients")
    data = {
        "progress": gather.progress(rounds),
        "time": gather.timing(store, rounds),
        "clients": clients.client_accuracy(store, counts),
        "groups": clients.groups(store),
        "participation": clients.participation(
            store, counts, num_clients if isinstance(num_clients, int) else len(counts)
        ),
        "updates": clients.updates(store),
        "refused": clients.refused(store),
        "alerts": gather.alerts(store, cfg),
        "privacy": gather.privacy(store, cfg),
        "bytes": gather.traffic(rounds),
        "versions": gather.versions(store),
        "setup": gather.setup(store, cfg),
    }
    return gather.identity(store, cfg, rounds), data


def report_html(store: RunStore) -> str:
    """The page of one run."""
    ident, data = gather_run(store)
    sections = [build(data[key]) for key, build in BUILDERS.items()]
    head = table(SUMMARY_HEADERS, [summary_row(ident)], text_columns=3)
    sections.insert(0, Section("run", "Run", ident, body=head))
    batch = ident["batch_size"] if ident["batch_size"] is not None else "all"
    subtitle = [
        f"{ident['name']} [{ident['status']}], created {ident['created']}",
        f"{ident['algorithm']} ({ident['mode']}), {ident['num_clients']} clients, "
        f"C={ident['client_fraction']} E={ident['local_epochs']} B={batch}, "
        f"{ident['rounds']} of {ident['rounds_planned']} rounds",
    ]
    summary = store.summary() or {}  # why a finished run ended before its last round
    subtitle += [summary[k] for k in EARLY_STOPS if isinstance(summary.get(k), str)]
    return render(f"fedforge report: {ident['run_id']}", subtitle, sections)


SUMMARY_HEADERS = [
    "run",
    "status",
    "algorithm",
    "C",
    "E",
    "B",
    "rounds",
    "best score",
    "final score",
    "bytes",
    "wall s",
    "epsilon",
    "virtual to target",
]


def summary_row(ident: Data) -> list[str]:
    """A run's line in a summary table (the report's header, ``compare``'s table)."""
    score = ident["score_name"]
    to_target = ident.get("virtual_seconds_to_target")
    best = named_score(ident["best_accuracy"], score)
    if ident["rounds_to_best"] is not None:
        best += f" (round {ident['rounds_to_best']})"
    return [
        ident["run_id"],
        ident["status"],
        ident["algorithm"],
        str(ident["client_fraction"]),
        str(ident["local_epochs"]),
        str(ident["batch_size"] if ident["batch_size"] is not None else "all"),
        str(ident["rounds"]),
        best,
        named_score(ident["final_accuracy"], score),
        format_bytes(ident["total_bytes"]),
        f"{ident['wall_seconds']:.1f}",
        num(ident["epsilon"], ".3f"),
        "-" if to_target is None else format_duration(to_target),
    ]


def write_html(page: str, out: Path) -> Path:
    """Write ``page`` to ``out`` whole (a temporary file renamed into place)."""
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write '{out}': {os_error_text(exc)}") from None
    return out


def write_report(run_dir: Path, out: Path) -> Path:
    """Write the report of the run at ``run_dir`` to ``out``."""
    with RunStore.open(run_dir, read_only=True) as store:
        page = report_html(store)
    return write_html(page, out)
