"""The fallback file: step rows are kept packed and other points as their channel messages, and read
back (by ``gpulse upload`` and ``gpulse report --from-file``) as the very lines the agent's encoder
writes for them (gpulse's parser and a real InfluxDB 1.x agree); a damaged line is named and the
rest still read; a full disk never leaves half a line (a real 64 KiB tmpfs, ``support/tmpfs.py``);
writing imports no line-protocol code (a run without an agent would pay its import with the GIL held)."""

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
from gpulse.channel.recording import POINT_MARK, ROWS_MARK, ROWS_PER_LINE, Recorder, count_records, read_records
from gpulse.lineprotocol.encode import Encoder
from gpulse.lineprotocol.parse import LineError, parse_line
from gpulse.lineprotocol.parse import ParsedLine as LinePoint

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


def record(path: Path, *batches: protocol.StepRows) -> None:
    recorder = Recorder(str(path))
    for batch in batches:
        assert recorder.write([batch], "node1") == len(batch)
    recorder.close()


def test_step_rows_read_back_as_the_agent_s_encoder_writes_their_points(tmp_path: Path) -> None:
    rows = steps(150)
    path = tmp_path / protocol.RECORD_FILE
    record(path, rows[:1], rows[1:])
    lines = path.read_text().splitlines()
    assert [line.split(" ")[:2] for line in lines] == [[ROWS_MARK.strip(), str(n)] for n in (1, ROWS_PER_LINE, ROWS_PER_LINE, 21)]  # fmt: skip
    encoder = Encoder()
    series = encoder.series("train_step", {**TAGS, "host": "node1"})
    read = list(read_records(path))
    assert [lineno for lineno, _, _ in read] == [1] + [2] * 64 + [3] * 64 + [4] * 21
    for (_, text, parsed), point in zip(read, rows.points(), strict=True):
        assert text == encoder.line(series, point.fields, point.ts)  # the agent's very text, floats too
        assert parsed == parse_line(text) == LinePoint("train_step", {**TAGS, "host": "node1"}, point.fields, point.ts)
    assert count_records(path) == 150
    assert path.stat().st_size < 0.6 * sum(len(t) for _, t, _ in read)  # packed: about half the text


def test_fields_outside_the_schema_are_left_out_when_read_as_the_agent_leaves_them_out(tmp_path: Path) -> None:
    shape = protocol.FieldShape(("step", "no_such_field"), "if")
    rows = protocol.StepRows(protocol.PointHead("train_step", TAGS), shape, [(i, 0.5, T0 + i) for i in range(3)])
    record(tmp_path / protocol.RECORD_FILE, rows)
    read = [p for _, _, p in read_records(tmp_path / protocol.RECORD_FILE)]
    assert [(p.fields, p.ts) for p in read] == [({"step": i}, T0 + i) for i in range(3)]  # type: ignore[union-attr]


def test_a_damaged_rows_line_is_named_by_its_number_and_every_other_line_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / protocol.RECORD_FILE
    record(path, steps(3))
    good = path.read_text()
    count, b64 = good.rstrip("\n")[len(ROWS_MARK) :].split(" ", 1)
    damaged = [
        f"{ROWS_MARK}{count} {b64[:-7]}\n",  # base64 cut short: no base64
        f"{ROWS_MARK}{count} {b64[:-8]}\n",  # base64 of rows cut short
        f"{ROWS_MARK}4 {b64}\n",  # a count the rows do not have
        f"{ROWS_MARK}1 {'A' * 40}\n",  # base64 of no rows datagram
    ]
    path.write_text(good + "".join(damaged) + good + good.rstrip("\n"))  # the last one torn: no newline
    read = list(read_records(path))
    errors = [(lineno, str(p)) for lineno, _, p in read if isinstance(p, LineError)]
    assert [lineno for lineno, _ in errors] == [2, 3, 4, 5, 7]
    assert "a damaged rows line" in errors[0][1]
    assert "a rows line the agent would refuse (bad_rows" in errors[1][1]
    assert "a damaged rows line (3 rows where the line says 4)" in errors[2][1]
    assert "a rows line the agent would refuse" in errors[3][1]
    assert "incomplete last line" in errors[4][1]
    assert [(lineno, p.fields["step"]) for lineno, _, p in read if not isinstance(p, LineError)] == [
        (1, 1), (1, 2), (1, 3), (6, 1), (6, 2), (6, 3),
    ]  # fmt: skip


def test_points_that_are_not_steps_read_back_as_the_agent_s_encoder_writes_them(tmp_path: Path) -> None:
    """The run's start and end and its events: one line each, the channel message, in the order given."""
    path = tmp_path / protocol.RECORD_FILE
    start = protocol.Point(
        "train_run", T0, TAGS, {"event": "start", "status": "running", "name": 'a "b"\nc ü', "pid": 7}
    )
    mark = protocol.Point("train_event", T0 + 5, TAGS, {"kind": "eval", "text": "line one\nline two", "step": 3})
    rows = steps(2)
    recorder = Recorder(str(path))
    assert recorder.write([start, rows, mark], "node1") == 4
    recorder.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == [POINT_MARK.strip(), ROWS_MARK.strip(), POINT_MARK.strip()]
    encoder = Encoder()
    read = list(read_records(path))
    assert [lineno for lineno, _, _ in read] == [1, 2, 2, 3]
    for (_, text, parsed), point in zip(read, [start, *rows.points(), mark], strict=True):
        tags = {**TAGS, "host": "node1"}
        assert text == encoder.line(encoder.series(point.measurement, tags), point.fields, point.ts)
        assert parsed == LinePoint(point.measurement, tags, parsed.fields, point.ts)  # type: ignore[union-attr]
    # the file kept one line a point; newlines become spaces as the agent's encoder writes them
    assert read[0][2].fields["name"] == 'a "b" c ü' and read[3][2].fields["text"] == "line one line two"  # type: ignore[union-attr]
    assert count_records(path) == 4


def test_a_damaged_point_line_is_named_by_its_number(tmp_path: Path) -> None:
    path = tmp_path / protocol.RECORD_FILE
    recorder = Recorder(str(path))
    recorder.write([protocol.Point("train_event", T0, TAGS, {"kind": "eval", "text": "", "step": 1})], "node1")
    recorder.close()
    good = path.read_text()
    path.write_text(good + good[:-12] + "\n" + POINT_MARK + "[1, 2]\n" + "@gpulse-later 1 AAAA\n" + good)
    read = list(read_records(path))
    errors = [(lineno, str(p)) for lineno, _, p in read if isinstance(p, LineError)]
    assert [lineno for lineno, _ in errors] == [2, 3, 4]
    assert "a point line the agent would refuse (bad_json" in errors[0][1]  # cut short: not JSON
    assert "a damaged point line" in errors[1][1]  # JSON, not a message
    assert "a damaged later line (not a kind of line this version writes)" in errors[2][1]
    assert [lineno for lineno, _, p in read if not isinstance(p, LineError)] == [1, 5]


def test_writing_a_recording_imports_no_line_protocol_code() -> None:
    """Importing it costs CPU on the run's background thread with the GIL held: the training loop
    would stand still that long at a run's first recording. Only reading the file needs the encoder."""
    code = (
        "import sys, tempfile, os\n"
        "from gpulse.channel import protocol\n"
        "from gpulse.channel.recording import Recorder\n"
        "r = Recorder(os.path.join(tempfile.mkdtemp(), 'x.rec'))\n"
        "r.write([protocol.Point('train_run', 1, {'run': 'a'}, {'event': 'start'})], 'node1')\n"
        "r.close()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('gpulse.lineprotocol', 'gpulse.schema', 'gpulse.channel.validate'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.influxdb
def test_influxdb_stores_the_recorded_steps_as_the_very_floats_of_the_run(
    influxdb: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    rows = steps(20)
    points = rows.points()
    record(tmp_path / protocol.RECORD_FILE, rows[:1], rows[1:])
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
from gpulse.channel.recording import PartialRecording, Recorder, read_records
from gpulse.lineprotocol.parse import ParsedLine
from support.tmpfs import fill
from test_recording import steps
disk = sys.argv[1]
fill(disk, leave=32768)  # room for a few lines of 64 steps, not for all
record = os.path.join(disk, "gpulse-records.rec")
said = {{}}
try:
    Recorder(record).write([steps(600)], "node1")
except PartialRecording as e:
    said = {{"error": e.strerror, "written": e.written, "lost": e.lost}}
read = list(read_records(record))
said.update(
    ends_with_newline=open(record, "rb").read().endswith(b"\\n"),
    bad=[str(p) for _, _, p in read if not isinstance(p, ParsedLine)],
    steps=[p.fields["step"] for _, _, p in read if isinstance(p, ParsedLine)],
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
    assert 0 < said["written"] < 600 and said["written"] + said["lost"] == 600  # some lines fitted
    assert said["written"] % ROWS_PER_LINE == 0  # whole lines of rows
    assert said["ends_with_newline"] and said["bad"] == []
    assert said["steps"] == list(range(1, said["written"] + 1))


@pytest.mark.parametrize(
    "names",
    [
        tuple(f"log_{i:04d}" for i in range(protocol.MAX_FIELDS + 1)),  # one field more than a point may have
        tuple(f"log_{i:04d}_" + "x" * 59 for i in range(1000)),  # and ~70 KB of names, longer than a datagram
    ],
    ids=["fields-over-a-point", "names-over-a-datagram"],
)
def test_steps_the_agent_would_refuse_for_their_size_are_recorded_at_once_and_named(
    tmp_path: Path, names: tuple[str, ...]
) -> None:
    """Not sent (the agent would refuse the datagram) and not lost: in the file, a point line, said once."""
    from gpulse.training.client import Client  # the training side's sender of rows
    from gpulse.training.errors import Guard

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
    assert line.startswith(POINT_MARK)
    ((_, _, point),) = read_records(tmp_path / protocol.RECORD_FILE)
    assert point.fields == dict.fromkeys(names, 0.5)  # type: ignore[union-attr]


def test_a_point_with_more_fields_than_the_agent_takes_is_recorded_at_once_and_named(tmp_path: Path) -> None:
    """The same for a point sent on its own, not as rows: the agent would refuse it (``bad_fields``)."""
    from gpulse.training.client import Client
    from gpulse.training.errors import Guard

    fields = {f"log_{i:04d}": 0.5 for i in range(protocol.MAX_FIELDS + 1)}
    guard = Guard()
    client = Client(str(tmp_path / "agent.sock"), str(tmp_path / protocol.RECORD_FILE), guard=guard)
    try:
        client.submit(protocol.Point("train_step", T0, TAGS, fields))
        assert (client.recorded, client.pending, guard.counts.get("oversize_message")) == (1, 0, 1)
    finally:
        client.close(wait=0)
    ((_, _, point),) = read_records(tmp_path / protocol.RECORD_FILE)
    assert point.fields == fields  # type: ignore[union-attr]
