"""Small truths of a run without its agent (issue 13, item 7): a short run says where its steps went,
a socket the user may not reach is named at once, and a full disk leaves whole lines and no stray
temporary file."""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.influxd import InfluxDB1
from support.tmpfs import on_tmpfs

from gpulse.channel.protocol import RECORD_FILE
from gpulse.training import Run
from gpulse.training.client import upload_command


@pytest.fixture
def auth_influxdb(tmp_path_factory: pytest.TempPathFactory):
    """A real InfluxDB 1.x that asks for credentials: the advice must carry them to work."""
    server = InfluxDB1(tmp_path_factory.mktemp("influxd-auth"), auth=True).start()
    server.query("CREATE USER admin WITH PASSWORD 'Adm1n-pw' WITH ALL PRIVILEGES")
    server.query("CREATE DATABASE gpulse", user=("admin", "Adm1n-pw"))
    yield server
    server.stop()


@pytest.mark.influxdb
def test_a_short_run_without_an_agent_says_once_at_the_end_where_its_steps_are_and_the_command_works(
    auth_influxdb: InfluxDB1,
    clean_env: dict[str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shorter than the 10 s acknowledgement timeout, such a run used to say nothing at all; the
    command it prints names the token file the run's environment names, so it works as printed."""
    creds = tmp_path / "secrets" / "influx creds"  # a space: the advice quotes what it names
    creds.parent.mkdir()
    creds.write_text("admin:Adm1n-pw\n")
    creds.chmod(0o600)
    monkeypatch.setenv("GPULSE_TOKEN_FILE", str(creds))
    out = tmp_path / "out"
    sock = tmp_path / "nobody" / "agent.sock"
    with caplog.at_level(logging.WARNING, logger="gpulse.training"):
        run = Run(name="short", output_dir=out, socket_path=str(sock), write_report=False, quiet=True)
        for _ in range(5):
            with run.step(samples=2):
                pass
        run.finish()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert said[0] == (
        f"gpulse: run {run.run_id}: 7 points are in {out / RECORD_FILE} (no agent at {sock}: no socket there); "
        f"`gpulse upload {out / RECORD_FILE} --token-file '{creds}'` sends them to the database"
    )
    command = re.search(r"`(gpulse upload [^`]+)`", said[0]).group(1)  # the advice, run as printed
    env = {**clean_env, "GPULSE_URL": auth_influxdb.url, "GPULSE_API": "v1", "GPULSE_BUCKET": "gpulse"}
    up = subprocess.run([sys.executable, "-m", *shlex.split(command)], env=env, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    rows = auth_influxdb.rows(f"SELECT step FROM train_step WHERE \"run\" = '{run.run_id}'", user=("admin", "Adm1n-pw"))
    assert sorted(r["step"] for r in rows) == [1, 2, 3, 4, 5]


def test_without_a_token_file_in_the_environment_the_advice_names_the_compose_stacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPULSE_TOKEN_FILE", raising=False)
    assert upload_command("out/gpulse-records.rec") == (
        "gpulse upload out/gpulse-records.rec --token-file secrets/influxdb-admin-token"
    )


FULL_DISK_RUN = """
import json, logging, os, sys
disk, sys.path[:0] = sys.argv[1], [sys.argv[2]]
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from gpulse.training import Run
from support.tmpfs import fill
fill(disk)  # one page left: room for a few steps, not for all, nor for the report
run = Run(name="full", output_dir=os.path.join(disk, "out"), socket_path=os.path.join(disk, "none.sock"))
for i in range(60):
    with run.step(samples=2, tokens=64):
        pass
    run.log(loss=1.0 / (i + 1))
run.finish()
from gpulse.channel.recording import read_records
from gpulse.lineprotocol.parse import ParsedLine
record = os.path.join(disk, "out", "gpulse-records.rec")
read = list(read_records(record))
print(json.dumps({
    "stats": run.stats(),
    "files": sorted(os.listdir(os.path.join(disk, "out"))),
    "ends_with_newline": open(record, "rb").read().endswith(b"\\n"),
    "bad": [str(p) for _, _, p in read if not isinstance(p, ParsedLine)],
    "lines": len(read),
}))
"""


def test_on_a_full_disk_a_run_leaves_whole_lines_no_temporary_report_and_says_what_was_lost(tmp_path: Path) -> None:
    """What a user saw: a recording ending in a torn line, and an empty ``metrics_report.json.<pid>.tmp``."""
    disk = tmp_path / "disk"
    disk.mkdir()
    out = subprocess.run(
        [*on_tmpfs(disk, "64k"), sys.executable, "-c", FULL_DISK_RUN, str(disk), str(Path(__file__).parents[1])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout)
    assert said["files"] == [RECORD_FILE]  # no metrics_report.json, and no .tmp beside it
    assert said["ends_with_newline"] and said["bad"] == []
    stats = said["stats"]
    assert 0 < stats["recorded"] == said["lines"] < 62
    assert stats["errors"]["record_write"] >= 1 and stats["errors"]["report_write"] == 1
    assert "report_write: metrics_report.json not written to" in out.stderr and "No space left on device" in out.stderr
    lost = re.search(r"(\d+) points were neither acknowledged by an agent nor recorded", out.stderr)
    assert lost and int(lost.group(1)) == 60 + 2 - stats["recorded"]  # 60 steps, the run's start and end
