"""docs/influxdb3.md, the table of InfluxDB 3 behaviours: every test it names exists, every source it cites is real.

The table is the closing list of issue 29 (each 3.x behaviour, its source, its test), so it must not rot:
a renamed or deleted test fails here, and so does a source file or name that is not in the server's
repository at the cited commit (checked where a snapshot of ``influxdata/influxdb`` is at hand:
``support.snapshots``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from support.fixtures import REPO
from support.snapshots import show, snapshot

DOC = REPO / "docs" / "influxdb3.md"
COMMIT = "d7834110b3680ba8e53d16333d158b18b8847bc7"
TEST_REF = re.compile(r"`((?:agent/)?tests/[\w/.-]+\.py)::(\w+)`")
#: a source file of the server's repository, then the names to find in it, up to the next file or ";"
SOURCE_FILE = re.compile(r"^(?:core/|influxdb3)[\w/.-]*\.rs$")


@dataclass(frozen=True)
class Row:
    number: int
    behaviour: str
    source: str
    tests: str


def rows() -> list[Row]:
    out = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and len(cells) == 5 and cells[0].isdigit():
            out.append(Row(int(cells[0]), cells[1], cells[2], cells[4]))
    return out


def _defined(path: Path, name: str) -> bool:
    return re.search(rf"^(?:async )?def {re.escape(name)}\(", path.read_text(), re.M) is not None


def _present(r: Row) -> list[tuple[str, str]]:
    """The tests a row names."""
    return TEST_REF.findall(r.tests)


def test_the_table_numbers_its_rows_and_each_row_names_a_source_and_a_present_test():
    table = rows()
    assert [r.number for r in table] == list(range(1, len(table) + 1)) and len(table) >= 30
    for r in table:
        assert r.source and _present(r), f"row {r.number}: {r.behaviour}"


def test_every_test_the_table_names_exists():
    missing = []
    for r in rows():
        for path, name in _present(r):
            file = REPO / path
            if not file.is_file() or not _defined(file, name):
                missing.append(f"row {r.number}: {path}::{name}")
    assert missing == []


def _sources(cell: str) -> list[tuple[str, list[str]]]:
    """``(file, [names])`` for each server source file the cell cites (H and S spelled out)."""
    cell = cell.replace("S `", "`influxdb3/src/commands/serve.rs` `").replace("H `", "`influxdb3_server/src/http.rs` `")
    out: list[tuple[str, list[str]]] = []
    for part in cell.split(";"):
        names: list[str] | None = None  # a part's names belong to the file it begins with
        for token in re.findall(r"`([^`]+)`", part):
            if SOURCE_FILE.match(token):
                names = []
                out.append((token, names))
            elif names is not None:
                names.append(token)
    return out


def test_the_sources_are_read_with_their_own_names():
    cited = [s for r in rows() for s in _sources(r.source)]
    assert len(cited) >= 40 and all(names for _, names in cited), [f for f, n in cited if not n]


def test_every_cited_source_file_holds_the_names_cited_at_the_commit():
    server = snapshot("influxdata/influxdb", COMMIT)
    wrong = []
    texts: dict[str, str] = {}
    for r in rows():
        for path, names in _sources(r.source):
            if path not in texts:
                texts[path] = show(server, COMMIT, path) or ""
            if not texts[path]:
                wrong.append(f"row {r.number}: no file {path}")
            for name in names:
                if name not in texts[path] and name.split("::")[-1].removeprefix("--") not in texts[path]:
                    wrong.append(f"row {r.number}: {name} not in {path}")
    assert wrong == []
