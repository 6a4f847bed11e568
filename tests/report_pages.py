"""What the report and compare tests share: two small real runs (made once a
session by conftest's ``report_runs``: one with per-client and per-group
evaluation (client tags from a CSV), drift diagnostics, refused uploads and
the alerts they fire, its name holding markup, one of its alert rules holding
a secret in its URL and command; one under central DP with a budget), and a
page read back as a browser's parser sees it (its sections, the JSON of each
``<script type="application/json">`` block, every script and link element's
attributes, each section's text)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import _make_data

from fedforge.config import from_dict
from fedforge.server.loop import run

# a run name is a folder name: no '/', so no closing tag; the markup must still
# reach the page as text
HOSTILE_NAME = "rep<b>x<script>alert(1)"
SECRET = "T0PSECRET"  # in an alert rule's URL and command: never on a page or in an export
SECRET_RULE = {
    "name": "secret",
    "kind": "no_progress",
    "threshold": 50,  # never fires in these runs: nothing is sent
    "url": f"https://hooks.example.com:8443/hook/{SECRET}?token={SECRET}",
    "command": [f"/opt/{SECRET}/bin/notify", "--token", SECRET],
}
# the report run's rules: the refusals fire the first two (logged, no action)
REPORT_RULES = [
    {"kind": "refused_rate", "threshold": 0.3},
    {"kind": "client_refused", "threshold": 1},
    SECRET_RULE,
]
TAGS_CSV = "client_id,region\n0,eu\n1,us\n2,eu\n3,us\n4,eu\n"  # client 5 untagged
BASE = {
    "model": "2nn",
    "num_clients": 6,
    "client_fraction": 0.5,
    "local_epochs": 1,
    "batch_size": 8,
    "lr": 0.05,
    "target_accuracy": None,
    "dtype": "float64",
    "checkpoint_every": 0,
}


def make_report_runs(root: Path) -> dict[str, Path]:
    """{'robust': run dir, 'dp': run dir}, both in ``root/runs``."""
    runs = root / "runs"
    tags = root / "tags.csv"
    tags.write_text(TAGS_CSV)
    data = _make_data([30, 12, 41, 25, 7, 33], num_test=40)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDFORGE_THREADS", "1")
        try:
            robust = run(
                from_dict(
                    {
                        **BASE,
                        "name": HOSTILE_NAME,
                        "rounds": 4,
                        "runs_dir": str(runs),
                        "evaluation": {"clients": True, "client_tags": str(tags)},
                        "alerts": {"rules": REPORT_RULES},
                        "robust": {
                            "attack": "nan_inf",
                            "attack_fraction": 0.34,
                            "max_refused_fraction": None,
                            "min_clients": 1,  # rounds with one honest client still step
                        },
                    }
                ),
                data,
            )
            dp = run(
                from_dict(
                    {
                        **BASE,
                        "name": "rep-dp",
                        "rounds": 3,
                        "runs_dir": str(runs),
                        "evaluation": {"every": 1},
                        "privacy": {
                            "dp": "central",
                            "noise_multiplier": 3.0,
                            "delta": 1e-3,
                            "target_epsilon": 3.0,
                        },
                    }
                ),
                data,
            )
        finally:
            torch.set_num_threads(before)
    assert robust.run_dir is not None and dp.run_dir is not None
    return {"robust": robust.run_dir, "dp": dp.run_dir}


@dataclass
class Page:
    sections: list[str] = field(default_factory=list)  # ids, in order
    data: dict[str, Any] = field(default_factory=dict)  # data-KEY blocks, parsed
    figures: list[dict[str, Any]] = field(default_factory=list)  # figure specs, parsed
    scripts: list[dict[str, str | None]] = field(default_factory=list)  # attributes
    links: list[dict[str, str | None]] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)  # every start tag's name
    text: dict[str, str] = field(default_factory=dict)  # section id -> its visible text
    empty: dict[str, str] = field(default_factory=dict)  # section id -> its no-data sentence


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._script: dict[str, str | None] | None = None
        self._body: list[str] = []
        self._section: str | None = None
        self._in_empty = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.page.tags.append(tag)
        if tag == "section":
            self._section = a["id"]
            self.page.sections.append(a["id"] or "")
            self.page.text[a["id"] or ""] = ""
        elif tag == "script":
            self.page.scripts.append(a)
            self._script, self._body = a, []
        elif tag == "link":
            self.page.links.append(a)
        elif tag == "p" and a.get("class") == "empty":
            self._in_empty = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            body, attrs = "".join(self._body), self._script
            if attrs.get("type") == "application/json":
                if attrs.get("class") == "ff-figure":
                    self.page.figures.append(json.loads(body))
                else:
                    self.page.data[(attrs.get("id") or "").removeprefix("data-")] = json.loads(body)
            self._script = None
        elif tag == "section":
            self._section = None
        elif tag == "p":
            self._in_empty = False

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._body.append(data)
        elif self._section is not None:
            self.page.text[self._section] += data
            if self._in_empty:
                self.page.empty[self._section] = data


def read_page(path: Path) -> Page:
    reader = _Reader()
    reader.feed(path.read_text(encoding="utf-8"))
    reader.close()
    return reader.page
