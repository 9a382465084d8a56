"""One suite for every spool strategy (one interface, one test suite run against each, as Telegraf's
``models/`` buffer tests do): what delivery needs from a spool, whatever stores it. It decided between
the segment spool and a SQLite WAL prototype (see :mod:`gpulse.delivery.spool`); a new strategy joins
``STRATEGIES`` and must pass it all.

Order and tickets across restarts; the size cap drops the oldest and counts them; SIGKILL between and
during appends; a torn last write; a flipped byte anywhere in what is on disk; a full disk (a real
tmpfs). Crashes happen in a child process that kills itself (no close, nothing flushed at exit).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.tmpfs import on_tmpfs

from gpulse.delivery.spool import Spool

STRATEGIES = {"segments": Spool}
KIB = 1024


@pytest.fixture(params=list(STRATEGIES))
def strategy(request: pytest.FixtureRequest) -> str:
    return request.param


def batch(k: int, n: int = 10) -> list[str]:
    return [f"m,b={k} v={i}i {1_700_000_000_000_000_000 + k * 1000 + i}\n" for i in range(n)]


def drain(s) -> list[list[str]]:
    out = []
    while (rec := s.peek()) is not None:
        out.append(rec.lines)
        assert s.ack(rec.segment, rec.offset)
    return out


def on_disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_order_and_tickets_survive_a_restart(strategy, tmp_path):
    s = STRATEGIES[strategy](tmp_path / "sp")
    for k in range(20):
        assert s.append(batch(k), epoch=7, end_ticket=10 * (k + 1)).lines == 10
    first = s.peek()
    assert (first.epoch, first.end_ticket, first.lines) == (7, 10, batch(0))
    assert s.peek() == first  # the same head until acked
    for _ in range(5):
        rec = s.peek()
        assert s.ack(rec.segment, rec.offset)
    s.close()
    again = STRATEGIES[strategy](tmp_path / "sp")
    recs = []
    while (rec := again.peek()) is not None:
        recs.append((rec.end_ticket, rec.lines))
        again.ack(rec.segment, rec.offset)
    assert recs == [(10 * (k + 1), batch(k)) for k in range(5, 20)]
    assert not again.has_data() and again.bytes == 0


def test_the_size_cap_keeps_the_newest_in_order_and_counts_what_it_dropped(strategy, tmp_path):
    cap = 64 * KIB
    s = STRATEGIES[strategy](tmp_path / "sp", max_bytes=cap)
    for k in range(300):  # ~1.8 MB through a 64 KiB spool
        assert s.append(batch(k, 40)).lines == 40
    assert on_disk(tmp_path / "sp") <= 2 * cap, on_disk(tmp_path / "sp")
    got = drain(s)
    assert got == [batch(k, 40) for k in range(300 - len(got), 300)] and len(got) >= 10
    assert s.lines_dropped == 40 * (300 - len(got))


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from gpulse.delivery.spool import Spool
    cls = {"segments": Spool}[sys.argv[1]]
    s = cls(sys.argv[2], max_bytes=int(sys.argv[4]))
    for k in range(int(sys.argv[3])):
        lines = [f"m,b={k} v={i}i {1_700_000_000_000_000_000 + k * 1000 + i}\\n" for i in range(10)]
        stored = s.append(lines, epoch=1, end_ticket=10 * (k + 1)).lines
        print(k, stored, flush=True)
    if sys.argv[5] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # a crash: nothing closed, nothing flushed
    s.close()
    """
)


def child(strategy: str, directory: Path, batches: int, *, crash: bool = True, max_bytes: int = 1 << 30, prefix=()):
    """Append ``batches`` batches in a child process that then dies by SIGKILL (or closes the spool)."""
    return subprocess.run(
        [*prefix, sys.executable, "-c", CHILD, strategy, str(directory), str(batches), str(max_bytes)]
        + ["kill" if crash else "close"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sigkill_while_appending_keeps_every_batch_whose_append_returned(strategy, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, strategy, str(tmp_path / "sp"), "100000", str(1 << 30), "kill"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    acked = -1
    while acked < 150:
        acked = int(proc.stdout.readline().split()[0])
    proc.send_signal(signal.SIGKILL)  # in the middle of some append
    proc.wait()
    got = drain(STRATEGIES[strategy](tmp_path / "sp"))
    assert len(got) > acked and got == [batch(k) for k in range(len(got))]  # a prefix, at least what returned


def test_a_torn_last_write_loses_at_most_that_batch(strategy, tmp_path):
    assert child(strategy, tmp_path / "sp", 50).returncode == -signal.SIGKILL
    newest = max((p for p in (tmp_path / "sp").iterdir() if p.is_file()), key=lambda p: p.stat().st_mtime_ns)
    os.truncate(newest, newest.stat().st_size - 50)  # the power went out during the last write
    s = STRATEGIES[strategy](tmp_path / "sp")
    got = drain(s)
    assert got in ([batch(k) for k in range(50)], [batch(k) for k in range(49)])


@pytest.mark.parametrize("where", [0.02, 0.25, 0.5, 0.75, 0.98])
def test_a_flipped_byte_loses_at_most_one_batch_and_the_loss_is_counted(strategy, tmp_path, where):
    assert child(strategy, tmp_path / "sp", 200, crash=False).returncode == 0
    data_file = max((p for p in (tmp_path / "sp").iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    raw = bytearray(data_file.read_bytes())
    raw[int(len(raw) * where)] ^= 0x5A
    data_file.write_bytes(bytes(raw))
    s = STRATEGIES[strategy](tmp_path / "sp")
    got = drain(s)
    assert len(got) >= 199 and all(b in [batch(k) for k in range(200)] for b in got)
    assert s.damaged_lines == 10 * (200 - len(got))  # counted


def test_a_full_disk_stores_nothing_partial_and_the_spool_keeps_working(strategy, tmp_path):
    mount = tmp_path / "sp"
    mount.mkdir()
    script = textwrap.dedent(
        """
        import json, sys
        from gpulse.delivery.spool import Spool
        s = {"segments": Spool}[sys.argv[1]](sys.argv[2] + "/spool", max_bytes=1 << 30)
        lines = lambda k: [f"m,b={k} v={i}i {1_700_000_000_000_000_000 + k * 1000 + i}\\n" for i in range(10)]
        stored = [k for k in range(400) if s.append(lines(k)).lines == 10]
        got = []
        while (rec := s.peek()) is not None:
            got.append(int(rec.lines[0].split(",b=")[1].split(" ")[0]))
            s.ack(rec.segment, rec.offset)
        after = [k for k in range(400, 410) if s.append(lines(k)).lines == 10]
        print(json.dumps({"stored": stored, "got": got, "after": after, "errors": s.write_errors}))
        """
    )
    out = subprocess.run(
        [*on_tmpfs(mount, "64k"), sys.executable, "-c", script, strategy, str(mount)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.splitlines()[-1])
    assert r["errors"] > 0 and 0 < len(r["stored"]) < 400  # the disk filled up
    assert r["got"] == r["stored"]  # exactly what was reported stored, in order, nothing torn
    assert r["after"] == list(range(400, 410))  # drained: room again
