"""Where a report goes: its JSON and HTML files, and the text (or the JSON) on stdout.

One place for ``gpulse report`` (a run or a node) and ``gpulse demo``, so they write the same files
the same way.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from gpulse.report.records import NodeReport, RunReport

Row = Mapping[str, Any]
RUN_FILES = ("metrics_report.json", "metrics_report.html")
NODE_FILES = ("node_report.json", "node_report.html")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_run_report(
    report: RunReport,
    out_dir: str,
    *,
    steps: Sequence[Row],
    gpu: Sequence[Row],
    events: Sequence[Row],
    html: bool,
    as_json: bool = False,
    stdout: TextIO | None = None,
) -> tuple[str, str | None]:
    """Write ``metrics_report.json`` (and ``.html``) into ``out_dir``, print the text (or the JSON);
    returns the paths written (json, html or ``None``)."""
    from gpulse.report.html import render_html
    from gpulse.report.text import render_text

    page = render_html(report, steps, gpu, events) if html else None
    return _emit(report.to_json(), render_text(report), page, out_dir, RUN_FILES, as_json, stdout)


def write_node_report(
    report: NodeReport,
    out_dir: str,
    *,
    gpu: Sequence[Row],
    html: bool,
    as_json: bool = False,
    stdout: TextIO | None = None,
) -> tuple[str, str | None]:
    """``node_report.json`` (and ``.html``), as :func:`write_run_report` does for a run."""
    from gpulse.report.html import render_node_html
    from gpulse.report.text import render_node_text

    page = render_node_html(report, gpu) if html else None
    return _emit(report.to_json(), render_node_text(report), page, out_dir, NODE_FILES, as_json, stdout)


def _emit(
    doc: dict[str, Any],
    text: str,
    page: str | None,
    out_dir: str,
    names: tuple[str, str],
    as_json: bool,
    stdout: TextIO | None,
) -> tuple[str, str | None]:
    out = stdout if stdout is not None else sys.stdout
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, names[0])
    _write(json_path, json.dumps(doc, indent=2, default=str) + "\n")
    html_path = None
    if page is not None:
        html_path = os.path.join(out_dir, names[1])
        _write(html_path, page)
    if as_json:
        json.dump(doc, out, indent=2, default=str)
        out.write("\n")
    else:
        out.write(text)
        out.write(f"\nwrote {json_path}" + (f" and {html_path}" if html_path else "") + "\n")
    return json_path, html_path
