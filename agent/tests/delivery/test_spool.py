"""The disk spool: what delivery needs from it, whatever stores it (one buffer interface, one suite, as
Telegraf's ``models/`` buffer tests do): a new storage strategy must pass it all.

Order and tickets across restarts; the size cap drops the oldest and counts them; SIGKILL between and
during appends; a torn last write; a flipped byte anywhere in what is on disk; a full disk (a real
tmpfs); and what ``gpulse doctor``/``status`` read from it. Crashes happen in a child process that
kills itself (no close, nothing flushed at exit).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.tmpfs import on_tmpfs

from gpulse.delivery import spool as spool_mod
from gpulse.delivery.spool import ACK_FILE, HEADER, Spool
from gpulse.util import files

KIB = 1024


def batch(k: int, n: int = 10) -> list[str]:
    return [f"m,b={k} v={i}i {k * 1000 + i}\n" for i in range(n)]


def drain(s: Spool) -> list[list[str]]:
    out = []
    while (rec := s.peek()) is not None:
        out.append(rec.lines)
        assert s.ack(rec.segment, rec.offset)
    return out


def on_disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def segments(path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.endswith(".seg"))


def first_segment_of(path, batches: int, segment_bytes: int = 1 << 20) -> Path:
    """Write ``batches`` batches to a spool at ``path`` and close it: the path of its first segment."""
    s = Spool(path, segment_bytes=segment_bytes)
    for k in range(batches):
        s.append(batch(k))
    s.close()
    return path / segments(path)[0]


def test_batches_come_back_in_order_with_their_tickets_and_the_directory_is_private(tmp_path):
    s = Spool(tmp_path / "sp", max_bytes=1 << 20, segment_bytes=2000)
    for k in range(20):
        assert s.append(batch(k), epoch=7, end_ticket=10 * (k + 1)).lines == 10
    assert stat.S_IMODE((tmp_path / "sp").stat().st_mode) == 0o700
    assert len(segments(tmp_path / "sp")) >= 3  # rotated
    rec = s.peek()
    assert (rec.epoch, rec.end_ticket) == (7, 10)
    assert s.peek() == rec  # the same head until acked
    assert drain(s) == [batch(k) for k in range(20)]
    assert not s.has_data() and s.bytes == 0 and segments(tmp_path / "sp") == []
    assert s.lines_spooled == 200


def test_a_restart_resumes_after_the_last_acked_record_with_its_tickets(tmp_path):
    s = Spool(tmp_path, segment_bytes=2000)
    for k in range(10):
        s.append(batch(k), epoch=7, end_ticket=10 * (k + 1))
    for _ in range(4):
        rec = s.peek()
        assert s.ack(rec.segment, rec.offset)
    s.close()  # like a crash: nothing else is written at exit
    again = Spool(tmp_path, segment_bytes=2000)
    recs = []
    while (rec := again.peek()) is not None:
        recs.append((rec.epoch, rec.end_ticket, rec.lines))
        again.ack(rec.segment, rec.offset)
    assert recs == [(7, 10 * (k + 1), batch(k)) for k in range(4, 10)]
    assert not again.has_data() and again.bytes == 0
    again.append(batch(99))  # a restarted spool appends to a new segment
    assert drain(again) == [batch(99)]


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from gpulse.delivery.spool import Spool
    s = Spool(sys.argv[1])
    for k in range(int(sys.argv[2])):
        lines = [f"m,b={k} v={i}i {k * 1000 + i}\\n" for i in range(10)]  # batch(k)
        stored = s.append(lines, epoch=1, end_ticket=10 * (k + 1)).lines
        print(k, stored, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # a crash: nothing closed, nothing flushed
    """
)


def crashing_child(directory: Path, batches: int) -> subprocess.Popen[str]:
    """A child process appending ``batches`` batches to a spool at ``directory``, then dying by SIGKILL."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), str(batches)], stdout=subprocess.PIPE, text=True
    )


def test_sigkill_while_appending_keeps_every_batch_whose_append_returned(tmp_path):
    proc = crashing_child(tmp_path / "sp", 100_000)
    assert proc.stdout is not None
    acked = -1
    while acked < 150:
        acked = int(proc.stdout.readline().split()[0])
    proc.send_signal(signal.SIGKILL)  # in the middle of some append
    proc.wait()
    got = drain(Spool(tmp_path / "sp"))
    assert len(got) > acked and got == [batch(k) for k in range(len(got))]  # a prefix, at least what returned


def test_a_torn_last_write_after_a_crash_loses_that_batch_counted_and_later_segments_survive(tmp_path):
    proc = crashing_child(tmp_path, 3)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    seg = tmp_path / segments(tmp_path)[0]
    os.truncate(seg, seg.stat().st_size - 50)  # the power went out during the last write
    again = Spool(tmp_path)
    again.append(batch(3))  # goes to a new segment
    assert drain(again) == [batch(0), batch(1), batch(3)]
    assert again.damaged_records == 1
    assert again.lines_dropped == again.damaged_lines == 10  # the torn record's header still says how many lines


@pytest.mark.parametrize("where", [0.02, 0.25, 0.5, 0.75, 0.98])
def test_a_flipped_byte_anywhere_loses_exactly_that_record_and_the_loss_is_counted(tmp_path, where):
    s = Spool(tmp_path, segment_bytes=1 << 20)
    for k in range(200):
        s.append(batch(k))
    s.close()
    seg = tmp_path / segments(tmp_path)[0]
    raw = bytearray(seg.read_bytes())
    raw[int(len(raw) * where)] ^= 0x5A
    seg.write_bytes(bytes(raw))
    again = Spool(tmp_path)
    got = drain(again)
    lost = [k for k in range(200) if batch(k) not in got]
    assert len(lost) == 1 and got == [batch(k) for k in range(200) if k not in lost]
    assert (again.damaged_records, again.damaged_lines, again.lines_dropped) == (1, 10, 10)


def test_a_damaged_header_resynchronises_on_the_next_good_record(tmp_path):
    seg = first_segment_of(tmp_path, 4)
    data = bytearray(seg.read_bytes())
    data[0:4] = b"XXXX"  # the first record's magic is gone
    seg.write_bytes(bytes(data))
    again = Spool(tmp_path)
    assert drain(again) == [batch(k) for k in range(1, 4)]
    assert again.damaged_records == 1 and again.lines_dropped >= 10


def test_garbage_files_and_a_bad_ack_file_never_crash_it(tmp_path):
    (tmp_path / "00000000000000000001.seg").write_bytes(b"\x00garbage\n" * 10)
    (tmp_path / "ack").write_text("not numbers")
    s = Spool(tmp_path)
    s.append(batch(1))
    assert drain(s) == [batch(1)]
    assert s.damaged_records == 1


def test_the_size_cap_drops_the_oldest_segments_keeps_the_newest_in_order_and_counts_what_it_dropped(tmp_path):
    cap = 64 * KIB
    s = Spool(tmp_path, max_bytes=cap)
    for k in range(300):  # ~1 MB through a 64 KiB spool
        assert s.append(batch(k, 40)).lines == 40
        assert s.bytes <= cap
    assert on_disk(tmp_path) - (tmp_path / ACK_FILE).stat().st_size <= cap  # the segments, besides the read position
    got = drain(s)
    assert got == [batch(k, 40) for k in range(300 - len(got), 300)]  # the newest survive, in order
    one = HEADER.size + len("".join(batch(299, 40)))
    assert (
        len(got) >= (cap - s.segment_bytes) // one - 1
    )  # the cap, less one segment dropped whole and the record being added
    assert s.lines_dropped == 40 * (300 - len(got))


def test_a_line_larger_than_the_whole_spool_is_refused(tmp_path):
    s = Spool(tmp_path, max_bytes=4096)
    assert s.append(["x" * 5000 + "\n"]).lines == 0
    assert not s.has_data()


def test_a_batch_larger_than_a_segment_is_stored_as_several_records_with_their_tickets(tmp_path):
    s = Spool(tmp_path, max_bytes=16384, segment_bytes=4096)
    lines = batch(1, 400)  # ~7 KB
    stored = s.append(lines, epoch=3, end_ticket=1200)
    assert stored.lines == 400 and len(stored.positions) > 1
    recs = []
    while (rec := s.peek()) is not None:
        recs.append(rec)
        s.ack(rec.segment, rec.offset)
    assert [line for r in recs for line in r.lines] == lines
    assert recs[-1].end_ticket == 1200 and len(recs) >= 2 and recs[0].end_ticket == 1200 - 400 + len(recs[0].lines)


FULL_DISK = textwrap.dedent(
    """
    import json, sys
    from gpulse.delivery.spool import Spool
    s = Spool(sys.argv[1] + "/spool", max_bytes=1 << 30)
    lines = lambda k: [f"m,b={k} v={i}i {k * 1000 + i}\\n" for i in range(10)]  # batch(k)
    stored = [k for k in range(400) if s.append(lines(k)).lines == 10]
    got = []
    while (rec := s.peek()) is not None:
        got.append(int(rec.lines[0].split(",b=")[1].split(" ")[0]))
        s.ack(rec.segment, rec.offset)
    after = [k for k in range(400, 410) if s.append(lines(k)).lines == 10]
    print(json.dumps({"stored": stored, "got": got, "after": after, "errors": s.write_errors,
                      "damaged": s.damaged_records}))
    """
)


def test_a_full_disk_stores_nothing_partial_and_the_spool_keeps_working_once_drained(tmp_path):
    mount = tmp_path / "sp"
    mount.mkdir()
    out = subprocess.run(
        [*on_tmpfs(mount, "64k"), sys.executable, "-c", FULL_DISK, str(mount)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.splitlines()[-1])
    assert r["errors"] > 0 and 0 < len(r["stored"]) < 400  # the disk filled up
    assert r["got"] == r["stored"]  # exactly what was reported stored, in order, nothing torn
    assert r["damaged"] == 0
    assert r["after"] == list(range(400, 410))  # drained: room again


def test_a_write_error_in_the_middle_of_a_record_is_undone_and_the_spool_keeps_going(tmp_path, monkeypatch):
    """EIO cannot be had from a real disk here (the full disk above gives ENOSPC): a write that stores half
    a record and then fails stands in for it."""
    s = Spool(tmp_path)
    s.append(batch(0))
    real = files.write_all

    def half_then_fail(fd, data):
        real(fd, data[: len(data) // 2])
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(files, "write_all", half_then_fail)
    assert s.append(batch(1)).lines == 0
    assert s.append(batch(2)).lines == 0
    assert s.write_errors == 2
    monkeypatch.setattr(files, "write_all", real)
    assert s.append(batch(3)).lines == 10
    assert drain(s) == [batch(0), batch(3)]
    assert s.damaged_records == 0


def test_a_spool_directory_of_another_user_is_refused(foreign_dir):
    with pytest.raises(PermissionError):
        Spool(foreign_dir)


def tree(path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_inspect_spool_reads_every_sinks_folder_without_changing_anything(tmp_path):
    influx = Spool(tmp_path / "influx", segment_bytes=1000)
    for k in range(1, 7):
        influx.append(batch(k))
    rec = influx.peek()
    influx.ack(rec.segment, rec.offset)  # batch 1 delivered: 5 batches wait
    influx.close()
    (tmp_path / "influx" / spool_mod.DESTINATION_FILE).write_text(
        "InfluxDB v2 API at http://db:8086 (org o, bucket b)\n"
    )
    record = Spool(tmp_path / "record")
    record.append(batch(9, 3))
    record.close()
    before = tree(tmp_path)

    summary = spool_mod.inspect_spool(tmp_path)

    assert tree(tmp_path) == before
    by_name = {s.name: s for s in summary.sinks}
    assert set(by_name) == {"influx", "record"}
    influx_s, record_s = by_name["influx"], by_name["record"]
    assert (influx_s.records, influx_s.lines, influx_s.damaged_records) == (5, 50, 0)
    assert influx_s.oldest_point_ns == 2000  # the first waiting line: batch 2's first
    assert influx_s.destination == "InfluxDB v2 API at http://db:8086 (org o, bucket b)"
    assert influx_s.bytes == sum(p.stat().st_size for p in (tmp_path / "influx").glob("*.seg"))
    assert (record_s.records, record_s.lines, record_s.oldest_point_ns, record_s.destination) == (1, 3, 9000, None)
    assert (summary.records, summary.lines, summary.oldest_point_ns) == (6, 53, 2000)
    assert summary.segments == influx_s.segments + record_s.segments >= 3


def test_inspect_spool_counts_damage_as_the_spool_will_skip_it(tmp_path):
    seg = first_segment_of(tmp_path / "influx", 4)
    data = bytearray(seg.read_bytes())
    data[HEADER.size + 5] ^= 0xFF  # the first record's payload
    seg.write_bytes(bytes(data))
    one = HEADER.size + len("".join(batch(0)))  # the damaged record, header and payload

    found = spool_mod.inspect_spool(tmp_path).sinks[0]

    assert (found.records, found.lines) == (3, 30)
    assert (found.damaged_records, found.damaged_bytes, found.damaged_lines) == (1, one, 10)
    assert found.oldest_point_ns == 1000
    again = Spool(tmp_path / "influx")
    assert drain(again) == [batch(k) for k in range(1, 4)] and again.lines_dropped == found.damaged_lines


def test_inspect_spool_of_an_empty_or_new_directory(tmp_path):
    empty = spool_mod.inspect_spool(tmp_path)
    assert (empty.segments, empty.records, empty.bytes, empty.oldest_point_ns, empty.sinks) == (0, 0, 0, None, ())
    with pytest.raises(OSError):
        spool_mod.inspect_spool(tmp_path / "missing")


@pytest.mark.parametrize("length", [0xFFFFFF, 3, 0], ids=["past-the-end", "short", "zero"])
def test_a_corrupted_length_field_loses_that_record_only_and_counts_exactly_what_was_lost(tmp_path, length, caplog):
    seg = first_segment_of(tmp_path, 4)
    data = bytearray(seg.read_bytes())
    first = HEADER.size + len("".join(batch(0)))
    data[first + 8 : first + 12] = length.to_bytes(4, "little")  # record 1's payload length
    seg.write_bytes(bytes(data))
    seen = spool_mod.inspect_spool(tmp_path)

    again = Spool(tmp_path)
    got = drain(again)

    written = [line for k in range(4) for line in batch(k)]
    read = [line for b in got for line in b]
    assert got == [batch(0), batch(2), batch(3)]
    assert again.damaged_lines == len(written) - len(read) == 10
    assert (again.damaged_records, again.lines_dropped) == (1, 10)
    assert again.damaged_bytes == HEADER.size + len("".join(batch(1)))
    assert (seen.damaged_lines, seen.damaged_bytes) == (again.damaged_lines, again.damaged_bytes)


def test_each_damaged_segment_is_logged_once_whatever_the_rate(tmp_path, caplog):
    s = Spool(tmp_path, segment_bytes=2 * (HEADER.size + len("".join(batch(7)))) + 1)  # two records per segment
    for k in range(8):
        s.append(batch(k))
    s.close()
    names = segments(tmp_path)
    assert len(names) == 4
    for name in names[:3]:  # both records of three segments are damaged
        seg = tmp_path / name
        data = bytearray(seg.read_bytes())
        data[HEADER.size + 3] ^= 0xFF
        data[-3] ^= 0xFF
        seg.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="gpulse.spool"):
        again = Spool(tmp_path)
        assert drain(again) == [batch(6), batch(7)]
    damaged = [r for r in caplog.records if "is damaged" in r.getMessage()]
    assert [r.getMessage().split(" is damaged")[0].rsplit(" ", 1)[1] for r in damaged] == ["1", "2", "3"]
    assert (again.damaged_records, again.damaged_lines) == (6, 60)


def five_batches_two_delivered(path) -> Path:
    s = Spool(path, segment_bytes=1 << 20)
    for k in range(5):
        s.append(batch(k))
    for _ in range(2):
        rec = s.peek()
        s.ack(rec.segment, rec.offset)
    s.close()
    return path / "ack"


def test_the_read_position_survives_a_restart_in_its_own_and_in_an_older_gpulse_format(tmp_path):
    five_batches_two_delivered(tmp_path / "new")
    assert drain(Spool(tmp_path / "new")) == [batch(k) for k in range(2, 5)]
    ack = five_batches_two_delivered(tmp_path / "old")
    seg, off = ack.read_text().split()[:2]
    ack.write_text(f"{int(seg)} {int(off)}\n")  # as an older gpulse wrote it
    assert drain(Spool(tmp_path / "old")) == [batch(k) for k in range(2, 5)]


def test_a_torn_read_position_replays_from_the_start_duplicates_but_no_loss(tmp_path):
    ack = five_batches_two_delivered(tmp_path)
    torn = bytearray(ack.read_bytes())
    torn[30] = ord("9") if torn[30] != ord("9") else ord("8")  # a crash while it was being overwritten
    ack.write_bytes(bytes(torn))
    assert drain(Spool(tmp_path)) == [batch(k) for k in range(5)]
