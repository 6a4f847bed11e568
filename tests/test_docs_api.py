"""The API reference (docs/api/*.md, built by ``make docs``) documents every
public name of ``fedforge``: each is listed under the module that defines it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import fedforge

DOCS = Path(__file__).resolve().parents[1] / "docs"


def documented() -> dict[str, set[str]]:
    """module -> the members its ``::: module`` block lists (every member when
    the block lists none: the empty set stands for all)."""
    found: dict[str, set[str]] = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        for block in re.split(r"^(?=::: )", page.read_text(), flags=re.M)[1:]:
            head, _, rest = block.partition("\n")
            module = head.removeprefix("::: ").strip()
            options = yaml.safe_load(rest.split("\n\n")[0]) if rest.startswith(" ") else None
            members = (options or {}).get("options", {}).get("members")
            found.setdefault(module, set()).update(members or [])
    return found


def test_every_public_name_is_in_the_api_reference() -> None:
    blocks = documented()
    missing = []
    for name in fedforge.__all__:
        module = fedforge._PUBLIC[name]
        if module not in blocks or (blocks[module] and name not in blocks[module]):
            missing.append(f"{name} ({module})")
    assert not missing, f"public names not in docs/api/*.md: {missing}"


def test_every_api_page_is_in_the_sites_navigation() -> None:
    text = (DOCS.parent / "mkdocs.yml").read_text()
    nav = yaml.safe_load(text)["nav"]
    pages = {p for entry in nav for v in entry.values() for p in _pages(v)}
    assert {f"api/{p.name}" for p in (DOCS / "api").glob("*.md")} <= pages
    assert {"index.md", "design.md", "results.md", "changelog.md"} <= pages


def _pages(v: object) -> list[str]:
    if isinstance(v, str):
        return [v]
    assert isinstance(v, list)
    return [p for entry in v for x in entry.values() for p in _pages(x)]
