"""Self-contained HTML pages of run stores: ``fedforge report RUN`` (one run)
and ``fedforge compare RUN RUN ...`` (several overlaid). Data is gathered from
the store (``gather.py``, ``clients.py``), drawn (``figures.py``) and laid out
(``page.py``) in separate steps."""

from fedforge.report.html.compare import compare_html, write_compare
from fedforge.report.html.run_report import report_html, write_report

__all__ = ["compare_html", "report_html", "write_compare", "write_report"]
