"""Each generated document is its generator's output, byte for byte: the docs follow the code they describe."""

from __future__ import annotations

import subprocess
import sys

from support.fixtures import REPO

from gpulse.docs import channel, report, schema


def test_docs_schema_md_is_generated_from_the_schema_module() -> None:
    assert (REPO / "docs" / "schema.md").read_text(encoding="utf-8") == schema.render_markdown(), (
        "docs/schema.md is stale: run `make generate`"
    )


def test_docs_report_md_is_generated_from_the_threshold_table_and_the_rules() -> None:
    assert (REPO / "docs" / "report.md").read_text(encoding="utf-8") == report.render_markdown(), (
        "docs/report.md is stale: run `make generate`"
    )


def test_the_channel_document_lists_the_causes_from_the_code() -> None:
    """``python -m gpulse.docs.channel`` prints the tables; docs/channel.md carries them verbatim."""
    assert channel.causes_markdown() in (REPO / "docs" / "channel.md").read_text(encoding="utf-8")


def test_each_generator_prints_its_document_when_run_as_a_module() -> None:
    """What ``make generate`` runs, and what the tables' text says to run."""
    for module, text in (
        ("gpulse.docs.schema", schema.render_markdown()),
        ("gpulse.docs.report", report.render_markdown()),
        ("gpulse.docs.channel", channel.causes_markdown()),
    ):
        out = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, check=True)
        assert out.stdout == text, module
