"""Every Flux script gpulse ships passes InfluxData's own Flux parser and type checker.

The checker is the npm package @influxdata/flux-lsp-browser (the Flux compiler front end built to
WebAssembly), pinned in tests/flux/package.json and run by tests/flux/check.mjs under node. CI
installs it with `npm ci --prefix tests/flux` (.ci/run); this test installs it the same way when missing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support import flux_parser
from support.fixtures import REPO

from gpulse.influx.downsample import TIERS, flux_query, flux_task

HARNESS = flux_parser.HARNESS


@pytest.fixture(scope="module")
def flux_check():
    """Runs the checker on files; returns one verdict dict per file."""
    try:
        node = flux_parser.ensure_installed()
    except flux_parser.FluxToolMissing as e:
        pytest.fail(str(e))
    assert json.loads(flux_parser.PACKAGE.read_text())["version"] == "0.8.40"

    def check(*files: Path) -> list[dict]:
        r = subprocess.run(
            [node, str(HARNESS / "check.mjs"), *map(str, files)], capture_output=True, text=True, timeout=120
        )
        assert r.returncode in (0, 1), f"flux checker failed to run (rc {r.returncode}): {r.stderr[-2000:]}"
        verdicts = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        assert len(verdicts) == len(files), r.stdout + r.stderr
        assert (r.returncode == 0) == all(v["ok"] for v in verdicts)
        return verdicts

    return check


def shipped_flux_files() -> list[Path]:
    skip = {".venv", "node_modules", ".git"}
    return sorted(p for p in REPO.rglob("*.flux") if not skip & set(p.relative_to(REPO).parts))


def test_every_flux_file_the_project_ships_passes_the_parser_and_type_checker(flux_check):
    files = shipped_flux_files()
    assert {p.name for p in files} >= {"gpulse_raw_to_1m.flux", "gpulse_1m_to_1h.flux"}
    bad = [v for v in flux_check(*files) if not v["ok"]]
    assert not bad, json.dumps(bad, indent=1)


def test_tasks_for_another_bucket_and_the_one_off_backfill_queries_pass_too(flux_check, tmp_path):
    scripts = {f"task_{t.name}.flux": flux_task(t, bucket="metrics") for t in TIERS}
    scripts |= {
        f"range_{t.name}.flux": flux_query(t, "gpulse", 1_700_000_000 * 10**9, 1_700_003_600 * 10**9) for t in TIERS
    }
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
    bad = [v for v in flux_check(*(tmp_path / n for n in scripts)) if not v["ok"]]
    assert not bad, json.dumps(bad, indent=1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.replace('|> to(bucket: "gpulse_1m")\n', '|> to(bucket: "gpulse_1m"\n', 1), "expected RPAREN"),
        (
            lambda s: s.replace("aggregateWindow(every: 1m, fn: max", "aggregateWindow(evry: 1m, fn: max"),
            "unexpected argument evry",
        ),
        (lambda s: s.replace("every: 1m, fn: mean", 'every: "1m", fn: mean'), "expected duration but found string"),
        (lambda s: s.replace("range(start: start,", "range(start: strat,", 1), "undefined identifier strat"),
        (
            lambda s: s.replace("aggregateWindow(every: 1m, fn: last", "aggregateWindw(every: 1m, fn: last"),
            "undefined identifier",
        ),
    ],
    ids=["missing-paren", "misspelled-argument", "wrong-type", "undefined-variable", "misspelled-function"],
)
def test_the_checker_rejects_a_broken_script_with_the_compilers_message(flux_check, tmp_path, change, message):
    good = flux_task(TIERS[0])
    broken = change(good)
    assert broken != good
    (tmp_path / "broken.flux").write_text(broken)
    (verdict,) = flux_check(tmp_path / "broken.flux")
    assert verdict["ok"] is False
    assert any(message in e["message"] for e in verdict["errors"]), verdict
