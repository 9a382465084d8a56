"""The fallback file: step points written from their shape's template read back as the encoder would
have written them (gpulse's parser and a real InfluxDB 1.x agree), and a full disk never leaves half
a line (a real 64 KiB tmpfs, ``support/tmpfs.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1
from support.tmpfs import on_tmpfs

from gpulse.channel import protocol
from gpulse.channel.recording import Recorder
from gpulse.lineprotocol.encode import Encoder
from gpulse.lineprotocol.parse import Point as LinePoint
from gpulse.lineprotocol.parse import parse_line

TAGS = {"run": "rec-1", "rank": "0", "local_rank": "0", "world_size": "1"}
NAMES = (
    "step", "start_time_ns", "end_time_ns", "step_time_s", "data_wait_s", "forward_s", "phase_grad_clip_s",
    "samples", "samples_per_s", "log_loss",
)  # fmt: skip
SHAPE = protocol.FieldShape(NAMES, "iii" + "nnnn" + "i" + "ff")  # ints, durations in ns, int, floats
T0 = 1_700_000_000_000_000_000


def steps(n: int) -> protocol.StepRows:
    head = protocol.PointHead("train_step", TAGS)
    rows = []
    for i in range(n):
        dt = 1_000_000 + 7919 * i
        t0 = T0 + i * 2_000_000
        loss = 10.0 ** (i % 40 - 20) / (i + 1)  # written with an exponent both ways: e-20 to e+19
        rows.append((i + 1, t0, t0 + dt, dt, 3021 + i, 700_001 + i, 12_345 * i, 32, 32 / (dt / 1e9), loss, t0 + dt))
    return protocol.StepRows(head, SHAPE, rows)


def test_step_rows_read_back_exactly_as_their_fields_and_as_the_encoder_would_write_them(tmp_path: Path) -> None:
    rows = steps(50)
    recorder = Recorder(str(tmp_path / protocol.RECORD_FILE))
    assert recorder.write([rows[:1]], "node1") == 1  # the encoder's own way: it learns the shape
    assert recorder.write([rows[1:]], "node1") == 49  # the template
    recorder.close()
    lines = (tmp_path / protocol.RECORD_FILE).read_text().splitlines()
    assert "step_time_s=1007919e-9" in lines[1]  # a duration from its nanoseconds
    encoder = Encoder()
    series = encoder.series("train_step", {**TAGS, "host": "node1"})
    for line, point in zip(lines, rows.points(), strict=True):
        parsed = parse_line(line)
        assert parsed == parse_line(encoder.line(series, point.fields, point.ts).rstrip("\n"))
        assert parsed == LinePoint("train_step", {**TAGS, "host": "node1"}, point.fields, point.ts)


def test_rows_of_a_shape_the_encoder_does_not_keep_whole_are_written_the_encoder_s_way(tmp_path: Path) -> None:
    """A name outside the schema has no template: every row goes through the encoder, which leaves it out."""
    shape = protocol.FieldShape(("step", "no_such_field"), "if")
    rows = protocol.StepRows(protocol.PointHead("train_step", TAGS), shape, [(i, 0.5, T0 + i) for i in range(3)])
    recorder = Recorder(str(tmp_path / protocol.RECORD_FILE))
    assert recorder.write([rows], "node1") == 3
    recorder.close()
    parsed = [parse_line(line) for line in (tmp_path / protocol.RECORD_FILE).read_text().splitlines()]
    assert [(p.fields, p.ts) for p in parsed] == [({"step": i}, T0 + i) for i in range(3)]


@pytest.mark.influxdb
def test_influxdb_stores_the_recorded_durations_as_the_very_floats_of_the_run(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    rows = steps(20)
    points = rows.points()
    recorder = Recorder(str(tmp_path / protocol.RECORD_FILE))
    recorder.write([rows[:1]], "node1")
    recorder.write([rows[1:]], "node1")
    recorder.close()
    up = subprocess.run(
        gpulse_cmd("upload", "--api", "v1", "--url", influxdb.url, "--bucket", "gpulse", str(tmp_path / protocol.RECORD_FILE)),
        env=clean_env, capture_output=True, text=True,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    rows = influxdb.rows('SELECT * FROM "train_step" WHERE "run" = \'rec-1\'')
    assert len(rows) == 20
    for row, point in zip(sorted(rows, key=lambda r: r["step"]), points, strict=True):
        for name in ("step_time_s", "data_wait_s", "forward_s", "phase_grad_clip_s", "samples_per_s", "log_loss"):
            assert row[name] == point.fields[name], name


FULL_DISK = """
import json, os, sys
sys.path[:0] = {path!r}
from gpulse.channel.recording import PartialRecording, Recorder
from gpulse.lineprotocol.parse import Point, read_lines
from support.tmpfs import fill
from test_recording import steps
disk = sys.argv[1]
fill(disk)  # one page left
record = os.path.join(disk, "gpulse-records.lp")
said = {{}}
try:
    Recorder(record).write([steps(60)], "node1")
except PartialRecording as e:
    said = {{"error": e.strerror, "written": e.written, "lost": e.lost}}
read = list(read_lines(record))
said.update(
    ends_with_newline=open(record, "rb").read().endswith(b"\\n"),
    bad=[str(p) for _, _, p in read if not isinstance(p, Point)],
    steps=[p.fields["step"] for _, _, p in read if isinstance(p, Point)],
)
print(json.dumps(said))
"""


def test_on_a_full_disk_the_recording_keeps_whole_lines_and_says_how_many(tmp_path: Path) -> None:
    """What a user saw: the file ended in a torn line, which ``gpulse upload`` then refused."""
    disk = tmp_path / "disk"
    disk.mkdir()
    code = FULL_DISK.format(path=[str(Path(__file__).parent), str(Path(__file__).parents[1])])
    out = subprocess.run(
        [*on_tmpfs(disk, "64k"), sys.executable, "-c", code, str(disk)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout)  # the file lives on the tmpfs, gone with the child: it looked for us
    assert said["error"] == "No space left on device"
    assert 0 < said["written"] < 60 and said["written"] + said["lost"] == 60  # one page held some lines
    assert said["ends_with_newline"] and said["bad"] == []
    assert said["steps"] == list(range(1, said["written"] + 1))


def test_step_rows_whose_field_names_alone_fill_a_datagram_are_recorded_at_once_and_named(tmp_path: Path) -> None:
    """Not sent (the agent would refuse the datagram as too large) and not lost: in the file, said once."""
    from gpulse.training.client import Client  # the training side's sender of rows
    from gpulse.training.errors import Guard

    names = tuple(f"log_{i:04d}_" + "x" * 59 for i in range(1000))  # ~70 KB of names (64 characters after log_)
    shape = protocol.FieldShape(names, "f" * len(names))
    rows = protocol.StepRows(protocol.PointHead("train_step", TAGS), shape, [(*(0.5,) * len(names), T0)])
    assert protocol.rows_per_datagram(rows.head, shape) == 0
    guard = Guard()
    client = Client(str(tmp_path / "agent.sock"), str(tmp_path / protocol.RECORD_FILE), guard=guard)
    try:
        client.submit_rows(rows)
        assert (client.recorded, client.pending, guard.counts.get("oversize_message")) == (1, 0, 1)
    finally:
        client.close(wait=0)
    (line,) = (tmp_path / protocol.RECORD_FILE).read_text().splitlines()
    assert parse_line(line).fields == dict.fromkeys(names, 0.5)
