"""One self-contained HTML page: sections of text, tables and plotly figures,
plotly.js embedded once (the page opens offline), and each section's data as a
``<script type="application/json" id="data-KEY">`` block that a reader (or a
test) can parse back.

Every text put into the page goes through :func:`html.escape`; JSON put into a
script block has ``<``, ``>`` and ``&`` written as ``\\u003c``... so no text can
end the block. Figures are specs in JSON blocks of class ``ff-figure`` that one
small script hands to ``Plotly.newPlot``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.io
import plotly.offline

from fedforge.report.html.figures import Figures

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;
  background:#fafafa}
header{background:#1f3b57;color:#fff;padding:18px 28px}
header h1{margin:0 0 4px;font-size:22px} header p{margin:2px 0;opacity:.85}
nav{padding:8px 28px;background:#e9eef3;font-size:14px} nav a{margin-right:14px;color:#1f3b57}
main{padding:8px 28px 40px;max-width:1200px}
section{background:#fff;border:1px solid #dde3ea;border-radius:6px;margin:18px 0;padding:12px 18px}
section h2{font-size:18px;margin:4px 0 8px}
p.empty{color:#777;font-style:italic}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border-bottom:1px solid #e3e3e3;padding:4px 10px;text-align:right}
th{background:#f1f4f7} td.text,th.text{text-align:left}
pre{background:#f6f8fa;padding:10px;overflow:auto;font-size:12px;max-height:420px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:8px}
"""

LOADER = """
document.querySelectorAll('script.ff-figure').forEach(function (s) {
  var spec = JSON.parse(s.textContent);
  Plotly.newPlot(s.dataset.target, spec.data, spec.layout,
                 {responsive: true, displaylogo: false});
});
"""


def _script_safe(json_text: str) -> str:
    """JSON text that no ``</script>`` or entity can break out of (the three
    characters appear only inside JSON strings, where the escapes mean the same)."""
    return json_text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def json_block(value: Any) -> str:
    """``value`` as JSON for a script element."""
    return _script_safe(json.dumps(value, allow_nan=False, separators=(",", ":")))


def _figure_json(fig: Any) -> str:
    return _script_safe(plotly.io.to_json(fig, validate=False))


@dataclass
class Section:
    """One section: its anchor ``key``, heading, and either a sentence saying the
    run has no data for it (``empty``) or its body (trusted HTML, built with
    :func:`text`, :func:`table`, :func:`pre`), data and figures."""

    key: str
    title: str
    data: Any
    body: str = ""
    figures: Figures = field(default_factory=list)
    empty: str | None = None


def text(sentence: str) -> str:
    return f"<p>{html.escape(sentence)}</p>"


def pre(content: str) -> str:
    return f"<pre>{html.escape(content)}</pre>"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], text_columns: int = 0) -> str:
    """A table; the first ``text_columns`` columns are left-aligned text."""

    def cell(tag: str, i: int, value: Any) -> str:
        cls = ' class="text"' if i < text_columns else ""
        return f"<{tag}{cls}>{html.escape('' if value is None else str(value))}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(s: Section) -> str:
    parts = [f'<section id="{html.escape(s.key)}">', f"<h2>{html.escape(s.title)}</h2>"]
    if s.empty is not None:
        parts.append(f'<p class="empty">{html.escape(s.empty)}</p>')
    else:
        parts.append(s.body)
        if s.figures:
            parts.append('<div class="grid">')
            for name, fig in s.figures:
                div = f"fig-{s.key}-{name}"
                parts.append(f'<div class="figure" id="{html.escape(div)}"></div>')
                parts.append(
                    f'<script type="application/json" class="ff-figure" '
                    f'data-target="{html.escape(div)}">{_figure_json(fig)}</script>'
                )
            parts.append("</div>")
    parts.append(
        f'<script type="application/json" id="data-{html.escape(s.key)}">'
        f"{json_block(s.data)}</script>"
    )
    parts.append("</section>")
    return "\n".join(parts)


def render(title: str, subtitle: Sequence[str], sections: Sequence[Section]) -> str:
    """The whole page."""
    nav = " ".join(f'<a href="#{html.escape(s.key)}">{html.escape(s.title)}</a>' for s in sections)
    lines = "".join(f"<p>{html.escape(line)}</p>" for line in subtitle)
    body = "\n".join(_section(s) for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{CSS}</style>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head>\n<body>"
        f"<header><h1>{html.escape(title)}</h1>{lines}</header><nav>{nav}</nav>"
        f"<main>\n{body}\n</main><script>{LOADER}</script></body></html>\n"
    )
