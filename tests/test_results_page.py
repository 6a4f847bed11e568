"""docs/results.md, the current figure of every benchmark: each script of
benchmarks/ has a row of its table (or is named on the page as a part of
another), each ``RESULT`` line of the table is recorded (in docs/changelog.md
or under benchmarks/results/), and each link into the changelog names one of
its headings, as the site's table of contents spells it."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import markdown

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RECORDS = BENCHMARKS / "results"
PAGE = ROOT / "docs" / "results.md"
CHANGELOG = ROOT / "docs" / "changelog.md"

RESULT_SPAN = re.compile(r"`(RESULT [^`]*)`")
RESULT_FORM = re.compile(r"RESULT( [A-Za-z0-9_]+=[^\s=]+)+")
ROW_NAME = re.compile(r"`([A-Za-z0-9_]+\.py)`")
CHANGELOG_LINK = re.compile(r"\]\((?:docs/)?changelog\.md#([^)\s]+)\)")


def table(text: str) -> list[list[str]]:
    """The cells of each row of the page's benchmark table (header and rule left out)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| benchmark |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def row_names(rows: list[list[str]]) -> list[str]:
    names = []
    for cells in rows:
        found = ROW_NAME.match(cells[0])
        assert found, f"a row's first cell names no script: {cells[0]!r}"
        names.append(found.group(1))
    return names


def is_part(path: Path) -> bool:
    """A module of benchmarks/ that is no benchmark of its own: it has no
    ``__main__`` block, and another benchmark imports it."""
    if '__name__ == "__main__"' in path.read_text():
        return False
    stem = re.escape(path.stem)
    imported = re.compile(rf"^\s*(from {stem} import|import {stem}\b)", re.M)
    others = (p for p in BENCHMARKS.glob("*.py") if p != path)
    return any(imported.search(p.read_text()) for p in others)


def flat(text: str) -> str:
    """Whitespace runs as one space: a line wrapped in the changelog still matches."""
    return re.sub(r"\s+", " ", text)


@cache
def recorded_texts() -> list[str]:
    texts = [flat(CHANGELOG.read_text())]
    for path in sorted(RECORDS.rglob("*")):
        if path.is_file() and path.suffix in {".txt", ".log", ".md", ".csv"}:
            texts.append(flat(path.read_text(errors="replace")))
    return texts


@cache
def common() -> ModuleType:
    """benchmarks/_common.py, whose ``result_line`` printed the JSON-recorded lines."""
    spec = importlib.util.spec_from_file_location("benchmarks_common", BENCHMARKS / "_common.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@cache
def json_figures() -> list[dict[str, object]]:
    found = []
    for path in sorted(RECORDS.rglob("*.json")):
        record = json.loads(path.read_text())
        if isinstance(record, dict) and isinstance(record.get("figures"), dict):
            found.append(record["figures"])
    return found


def in_json_record(line: str) -> bool:
    """The line is what ``result_line`` prints for its keys of one JSON record's figures."""
    keys = [part.split("=", 1)[0] for part in line.split()[1:]]
    return any(
        set(keys) <= figures.keys() and common().result_line({k: figures[k] for k in keys}) == line
        for figures in json_figures()
    )


def is_recorded(line: str) -> bool:
    whole = re.compile(re.escape(line) + r"(?![^\s`])")  # not the start of a longer line
    return any(whole.search(text) for text in recorded_texts()) or in_json_record(line)


def changelog_anchors() -> set[str]:
    md = markdown.Markdown(extensions=["toc"])
    md.convert(CHANGELOG.read_text())
    ids: set[str] = set()
    pending = list(md.toc_tokens)
    while pending:
        token = pending.pop()
        ids.add(token["id"])
        pending.extend(token["children"])
    return ids


def test_every_benchmark_script_has_a_row_and_every_other_module_is_a_named_part() -> None:
    text = PAGE.read_text()
    names = set(row_names(table(text)))
    scripts = sorted(BENCHMARKS.glob("*.py"))
    parts = {p.name for p in scripts if is_part(p)} | {"_common.py"}
    missing = [p.name for p in scripts if p.name not in names and p.name not in parts]
    assert not missing, f"benchmarks without a row in docs/results.md: {missing}"
    assert not names & parts, f"parts given a row of their own: {sorted(names & parts)}"
    assert names <= {p.name for p in scripts}, "a row names a script benchmarks/ lacks"
    intro = text[: text.index("| benchmark |")]
    unnamed = [name for name in sorted(parts) if f"`{name}`" not in intro]
    assert not unnamed, f"parts not named above the table: {unnamed}"


def test_every_result_line_has_its_form_and_is_recorded() -> None:
    rows = table(PAGE.read_text())
    assert len(rows[0]) == 5, rows[0]
    lines = []
    for cells in rows:
        spans = RESULT_SPAN.findall(cells[3])
        assert spans or cells[3].startswith("not recorded"), cells
        lines.extend(spans)
    bad_form = [line for line in lines if not RESULT_FORM.fullmatch(line)]
    assert not bad_form, bad_form
    unrecorded = [line for line in lines if not is_recorded(line)]
    assert not unrecorded, f"RESULT lines in no changelog entry or record: {unrecorded}"


def test_every_link_into_the_changelog_names_one_of_its_headings() -> None:
    anchors = changelog_anchors()
    for page in (PAGE, ROOT / "README.md", ROOT / "docs" / "design.md"):
        links = CHANGELOG_LINK.findall(page.read_text())
        assert page != PAGE or links, "the results page links into the changelog"
        broken = sorted(set(links) - anchors)
        assert not broken, f"{page.name}: no such heading in docs/changelog.md: {broken}"


def test_each_row_links_where_its_line_was_recorded() -> None:
    for cells in table(PAGE.read_text()):
        if RESULT_SPAN.search(cells[3]):
            assert CHANGELOG_LINK.search(cells[4]), cells[0]
