"""mkdocs hooks: the site's first page (``index.md``) is the README, read at
build time, whose links to the other pages (``docs/NAME.md``, the way they lie
in the repository) point beside it, where they lie on the site."""

from __future__ import annotations

from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "index.md":
        return markdown
    return README.read_text(encoding="utf-8").replace("](docs/", "](")
