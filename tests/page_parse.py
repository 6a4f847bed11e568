"""Reading a report page back as a browser's parser sees it: its sections, the
JSON of each ``<script type="application/json">`` block, every script and link
element's attributes, and each section's text."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any


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
