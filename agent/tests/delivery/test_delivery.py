"""Delivery as a whole: tickets and durability, the record file, restarts, SIGKILL, a tiny or full spool.

The database here is ``FakeInfluxV2`` (see ``support/fake_influx_v2.py``: it stands in for
InfluxDB 2's documented write endpoint); the v1 sink is tested against a real InfluxDB 1.x in
``test_sink_v1.py``.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support.fake_influx_v2 import FakeInfluxV2
from support.influxd import free_port
from support.waiting import wait_until

from gpulse.delivery import spool as spool_mod
from gpulse.delivery.oneshot import deliver_batches
from gpulse.delivery.pipeline import Delivery
from gpulse.delivery.retry import RetryPolicy
from gpulse.delivery.spool import store as spool_store
from gpulse.delivery.worker import Mode
from gpulse.influx.connection import ConfigError, Connection
from gpulse.sinks.factory import build_sinks
from gpulse.sinks.influx_v1 import InfluxV1Sink
from gpulse.sinks.influx_v2 import InfluxV2Sink
from gpulse.sinks.record import RecordSink

TOKEN = "secret-token"
FAST = RetryPolicy(initial=0.02, max_delay=0.1, config_min_delay=0.0)
T0 = 1_700_000_000_000_000_000


def lp(i: int) -> str:
    return f"m,host=h v={i}i {T0 + i}\n"


def v2(url: str) -> InfluxV2Sink:
    return InfluxV2Sink(url, TOKEN, "gpulse", "gpulse", timeout_s=2)


def wait_for(cond, timeout: float = 10.0) -> None:
    wait_until(cond, timeout, every=0.01)


@pytest.fixture
def fake():
    server = FakeInfluxV2(token=TOKEN).start()
    yield server
    server.stop()


def test_stats_have_exactly_the_documented_keys_and_nothing_before_the_first_write(tmp_path):
    d = Delivery([RecordSink(tmp_path / "r.lp")], spool_dir=None)
    s = d.stats()
    assert set(s) == {
        "lines_written",
        "lines_spooled",
        "lines_replayed",
        "lines_dropped",
        "lines_rejected",
        "spool_bytes",
        "spool_damaged_lines",
        "spool_damaged_bytes",
        "buffer_lines",
        "write_latency_ms",
        "last_write_age_s",
        "last_write_unix",
    }
    assert s["last_write_age_s"] is None and s["last_write_unix"] is None and s["write_latency_ms"] is None


def test_the_record_file_gets_every_line_as_plain_line_protocol(tmp_path):
    path = tmp_path / "rec" / "out.lp"
    d = Delivery(build_sinks(None, str(path)), spool_dir=tmp_path / "spool", flush_interval=0.05)
    d.start()
    lines = [lp(i) for i in range(2500)]
    for i in range(0, 2500, 100):
        assert d.submit(lines[i : i + 100]) == i + 100
    assert d.flush(5) and d.durable_upto == 2500
    d.close(2)
    assert path.read_text() == "".join(lines)
    assert d.stats()["lines_written"] == 2500


def test_build_sinks_follows_the_connection(tmp_path):
    assert build_sinks(Connection(url=None), str(tmp_path / "r.lp"))[0].name == "record"
    v1 = build_sinks(Connection(url="http://127.0.0.1:1", api="v1", bucket="db/rp", token="u:p"), None)
    assert isinstance(v1[0], InfluxV1Sink) and (v1[0].database, v1[0].retention_policy) == ("db", "rp")
    both = build_sinks(Connection(url="http://127.0.0.1:1", token="t"), str(tmp_path / "r.lp"))
    assert [type(s) for s in both] == [InfluxV2Sink, RecordSink]
    with pytest.raises(ConfigError):
        build_sinks(None, None)


def test_durable_upto_waits_for_every_sink(fake, tmp_path):
    port = free_port()  # nothing listens there
    d = Delivery(
        [v2(f"http://127.0.0.1:{port}"), RecordSink(tmp_path / "r.lp")],
        spool_dir=None,
        flush_interval=0.05,
        policy=FAST,
    )
    d.start()
    d.submit([lp(i) for i in range(10)])
    time.sleep(0.5)
    assert d.durable_upto == 0  # the record file has it, the database does not, and there is no spool
    assert not d.flush(0.3)
    back = FakeInfluxV2(token=TOKEN, port=port).start()
    try:
        assert d.flush(10)
        assert d.durable_upto == 10 and back.lines == [lp(i) for i in range(10)]
    finally:
        d.close(2)
        back.stop()


def test_close_spools_what_the_database_did_not_take_and_a_restart_replays_it_first(tmp_path):
    port = free_port()
    spool = tmp_path / "spool"
    d = Delivery([v2(f"http://127.0.0.1:{port}")], spool_dir=spool, flush_interval=0.05, policy=FAST)
    d.start()
    d.submit([lp(i) for i in range(300)])
    t0 = time.monotonic()
    d.close(5)
    assert time.monotonic() - t0 < 2.0  # everything was durable and the database down: no point waiting
    assert d.stats()["lines_spooled"] == 300 and d.stats()["spool_bytes"] > 0
    assert stat_mode(spool) == 0o700 and stat_mode(spool / "influx") == 0o700

    back = FakeInfluxV2(token=TOKEN, port=port).start()  # the same destination, up again
    try:
        again = Delivery([v2(back.url)], spool_dir=spool, flush_interval=0.05, policy=FAST)
        again.start()
        again.submit([lp(i) for i in range(300, 400)])  # new data goes behind the backlog
        assert again.flush(10)
        again.close(2)
        assert back.lines == [lp(i) for i in range(400)]
    finally:
        back.stop()
    s = again.stats()
    assert (s["lines_written"], s["spool_bytes"]) == (400, 0)
    assert 300 <= s["lines_replayed"] <= 400  # the new lines too, if they queued behind the backlog


def stat_mode(p: Path) -> int:
    return os.stat(p).st_mode & 0o777


def test_a_tiny_spool_stays_alive_drops_the_oldest_and_counts_them(fake, tmp_path):
    port = free_port()
    d = Delivery(
        [v2(f"http://127.0.0.1:{port}")],
        spool_dir=tmp_path / "spool",
        spool_max_bytes=16 << 10,
        flush_interval=0.05,
        policy=FAST,
    )
    d.start()
    for k in range(40):  # ~1.4 MB through a 16 KiB spool
        d.submit([lp(1000 * k + i) for i in range(1000)])
        time.sleep(0.01)
    wait_for(lambda: d.durable_upto == 40_000)
    s = d.stats()
    assert s["spool_bytes"] <= 16 << 10 and s["lines_dropped"] > 30_000
    back = FakeInfluxV2(token=TOKEN, port=port).start()
    try:
        assert d.flush(10)
        d.close(2)
        s = d.stats()
        assert s["lines_written"] + s["lines_dropped"] == 40_000  # every line accounted for
        got = [int(line.split("v=")[1].split("i")[0]) for line in back.lines]
        assert got == sorted(set(got)) and got[-1] == 39_999  # in order, no duplicates
        tail = got[-300:]  # what the spool kept at the end: the newest lines, without a gap
        assert tail == list(range(40_000 - 300, 40_000))
    finally:
        back.stop()


def test_a_full_disk_keeps_batches_in_memory_unacknowledged_until_the_spool_or_the_database_takes_them(
    tmp_path, monkeypatch
):
    port = free_port()
    d = Delivery([v2(f"http://127.0.0.1:{port}")], spool_dir=tmp_path / "spool", flush_interval=0.05, policy=FAST)
    real = spool_store.append_fsync

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_store, "append_fsync", enospc)
    d.start()
    d.submit([lp(i) for i in range(100)])  # A: in flight, failing, cannot be spooled: kept in memory
    wait_for(lambda: d.workers[0].retries >= 3)
    d.submit([lp(i) for i in range(100, 200)])  # B: cannot be spooled: kept in memory, behind A
    wait_for(lambda: d.stats()["buffer_lines"] == 200)
    time.sleep(0.2)  # several flush intervals: still nothing durable, nothing dropped
    s = d.stats()
    assert (d.durable_upto, s["lines_dropped"], s["lines_spooled"], s["buffer_lines"]) == (0, 0, 0, 200)
    monkeypatch.setattr(spool_store, "append_fsync", real)
    d.submit([lp(i) for i in range(200, 300)])  # C: the disk has room again: A (a copy), B, then C are spooled
    wait_for(lambda: d.durable_upto == 300)
    assert (d.stats()["lines_spooled"], d.stats()["lines_dropped"]) == (300, 0)
    back = FakeInfluxV2(token=TOKEN, port=port).start()
    try:
        assert d.flush(10)
        d.close(2)
        assert back.lines == [lp(i) for i in range(300)]  # in order, once
        s = d.stats()
        assert (s["lines_written"], s["lines_dropped"]) == (300, 0)
    finally:
        back.stop()


def test_lines_dropped_for_good_are_never_acknowledged(tmp_path, monkeypatch):
    port = free_port()
    d = Delivery(
        [v2(f"http://127.0.0.1:{port}")],
        spool_dir=tmp_path / "spool",
        flush_interval=0.05,
        max_lines=100,
        memory_max_bytes=20_000,
        policy=FAST,
    )

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_store, "append_fsync", enospc)
    d.start()
    for k in range(20):  # ~68 KB into a 20 KB memory cap, with a full disk and the database down
        d.submit([lp(100 * k + i) for i in range(100)])
        time.sleep(0.02)
    wait_for(lambda: d.stats()["lines_dropped"] > 0)
    first_lost = 100  # batch 0 is in flight; the oldest batches queued behind it are dropped first
    back = FakeInfluxV2(token=TOKEN, port=port).start()
    try:
        assert d.flush(10)
        s = d.stats()
        assert s["lines_written"] + s["lines_dropped"] == 2000
        got = {int(line.split("v=")[1].split("i")[0]) for line in back.lines}
        assert got >= set(range(100)) and min(set(range(2000)) - got) == first_lost
        assert d.durable_upto == first_lost  # everything after the loss was delivered, yet never acked
        d.submit([lp(2000)])
        assert d.flush(10) and d.durable_upto == first_lost
    finally:
        d.close(2)
        back.stop()


def test_without_a_spool_memory_is_capped_and_the_overflow_counted(tmp_path):
    port = free_port()
    d = Delivery(
        [v2(f"http://127.0.0.1:{port}")],
        spool_dir=None,
        flush_interval=0.05,
        max_lines=100,
        memory_max_bytes=20_000,
        policy=FAST,
    )
    d.start()
    for k in range(20):
        d.submit([lp(100 * k + i) for i in range(100)])
        time.sleep(0.02)
    time.sleep(0.2)
    s = d.stats()
    assert s["lines_dropped"] > 0 and s["buffer_lines"] * 34 <= 2 * 20_000
    d.close(0.5)
    assert d.stats()["lines_dropped"] + d.stats()["lines_written"] == 2000


def test_deliver_batches_pushes_a_file_synchronously_with_the_same_policy(fake, tmp_path):
    lines = [lp(i) for i in range(1000)]
    lines[500] = "not line protocol\n"
    r = deliver_batches(v2(fake.url), iter(lines), max_lines=300, policy=FAST, dead_letter_path=tmp_path / "dl.lp")
    assert (r.written, r.rejected, r.failed) == (999, 1, 0)
    assert "not line protocol\n" in (tmp_path / "dl.lp").read_text()
    dead = deliver_batches(v2(f"http://127.0.0.1:{free_port()}"), iter(lines[:10]), policy=FAST, deadline_s=0.3)
    assert (dead.written, dead.failed) == (0, 10)
    fake.token = "another"  # a wrong token fails at once, without waiting for a deadline
    t0 = time.monotonic()
    denied = deliver_batches(v2(fake.url), iter(lines[:10]), max_lines=3, policy=FAST)
    assert (denied.written, denied.failed) == (0, 10) and "HTTP 401" in denied.error
    assert time.monotonic() - t0 < 2.0


CHILD = textwrap.dedent(
    """
    import sys, time
    from gpulse.delivery.pipeline import Delivery
    from gpulse.delivery.retry import RetryPolicy
    from gpulse.sinks.influx_v2 import InfluxV2Sink
    url, spool = sys.argv[1], sys.argv[2]
    d = Delivery([InfluxV2Sink(url, "t", "gpulse", "gpulse", timeout_s=1)], spool_dir=spool, flush_interval=0.2,
                 policy=RetryPolicy(initial=0.05, max_delay=0.2))
    d.start()
    n = 0
    while True:
        n = d.submit([f"m,host=h v={n + i}i {1_700_000_000_000_000_000 + n + i}\\n" for i in range(20)])
        print(n, time.monotonic(), flush=True)
        time.sleep(0.02)
    """
)


def test_sigkill_while_the_database_is_down_loses_at_most_one_flush_interval(tmp_path):
    port = free_port()
    spool = tmp_path / "spool"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, f"http://127.0.0.1:{port}", str(spool)], stdout=subprocess.PIPE, text=True
    )
    progress: list[tuple[int, float]] = []
    try:
        assert child.stdout is not None
        while not progress or progress[-1][1] - progress[0][1] < 1.5:
            ticket, at = child.stdout.readline().split()
            progress.append((int(ticket), float(at)))
    finally:
        killed_at = time.monotonic()
        child.send_signal(signal.SIGKILL)
        child.wait()
    back = FakeInfluxV2(token="t", port=port).start()  # the child's destination, up again
    try:
        d = Delivery([InfluxV2Sink(back.url, "t", "gpulse", "gpulse", timeout_s=1)], spool_dir=spool, policy=FAST)
        d.start()
        assert d.flush(10)
        d.close(2)
    finally:
        back.stop()
    recovered = len(back.lines)
    assert back.lines == [lp(i) for i in range(recovered)]  # a prefix, in order
    # everything submitted more than one flush interval (+ scheduling slack) before the kill survived
    must = max((t for t, at in progress if at < killed_at - 0.2 - 0.3), default=0)
    assert must > 0 and recovered >= must


class TricklingServer:
    """Answers every request with a status line, then one header byte every 0.2 s, forever: a socket
    timeout never fires, so only a deadline can end the request (issue 15's "write that never ends")."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            self.requests += 1
            conn.sendall(b"HTTP/1.1 204 No Content\r\nX-Slow: ")
            while not self._stop.wait(0.2):
                try:
                    conn.sendall(b"z")
                except OSError:
                    return

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()


def test_close_returns_within_its_timeout_while_a_request_hangs_and_the_batch_stays_in_the_spool(tmp_path):
    server = TricklingServer()
    sink = InfluxV1Sink(server.url, "gpulse", timeout_s=5)
    d = Delivery([sink], spool_dir=tmp_path / "spool", flush_interval=0.05, policy=FAST)
    try:
        d.start()
        d.submit([lp(i) for i in range(50)])
        wait_for(lambda: server.requests >= 1)
        wait_for(lambda: d.durable_upto == 50)  # it waited a flush interval in flight: copied to the spool
        t0 = time.monotonic()
        d.close(1.0)
        took = time.monotonic() - t0
    finally:
        server.stop()
    # the request would have hung for its whole 5 s deadline: close neither waited for it nor for the sink's
    # close (which aborts the request, so whether the sink thread has ended by now is a matter of timing)
    assert took < 1.0 + 0.3, took
    assert spool_mod.inspect_spool(tmp_path / "spool").lines == 50
    assert d.stats()["lines_dropped"] == 0


def test_a_sink_worker_goes_from_memory_to_spooling_and_back_and_replays_a_backlog_first(tmp_path):
    port = free_port()
    d = Delivery([v2(f"http://127.0.0.1:{port}")], spool_dir=tmp_path / "spool", flush_interval=0.05, policy=FAST)
    w = d.workers[0]
    assert w.mode is Mode.MEMORY
    d.start()
    d.submit([lp(i) for i in range(10)])
    wait_for(lambda: w.mode is Mode.SPOOLING and d.durable_upto == 10)  # the database is down
    back = FakeInfluxV2(token=TOKEN, port=port).start()
    try:
        assert d.flush(10)
        wait_for(lambda: w.mode is Mode.MEMORY)  # the spool is drained
    finally:
        back.stop()
    d.submit([lp(i) for i in range(10, 20)])
    d.close(0.5)  # down again: spooled at the deadline
    assert w.mode is Mode.CLOSING

    back = FakeInfluxV2(token=TOKEN, port=port).start()
    try:
        again = Delivery([v2(back.url)], spool_dir=tmp_path / "spool", flush_interval=0.05, policy=FAST)
        assert again.workers[0].mode is Mode.REPLAYING_BACKLOG and again.workers[0].done_upto() == -1
        again.start()
        again.submit([lp(20)])
        assert again.flush(10) and again.workers[0].mode is not Mode.REPLAYING_BACKLOG
        again.close(2)
        assert back.lines == [lp(i) for i in range(10, 21)]
    finally:
        back.stop()


def test_a_spool_belongs_to_its_destination_and_is_replayed_elsewhere_only_when_asked(fake, tmp_path, caplog):
    spool = tmp_path / "spool"
    down = free_port()
    first = Delivery([v2(f"http://127.0.0.1:{down}")], spool_dir=spool, flush_interval=0.05, policy=FAST)
    first.start()
    first.submit([lp(i) for i in range(202)])
    first.close(0.5)  # the database is down: spooled for http://127.0.0.1:<down>
    assert spool_mod.inspect_spool(spool).sinks[0].lines == 202

    other = FakeInfluxV2(token=TOKEN).start()
    try:
        with caplog.at_level(logging.WARNING, logger="gpulse.spool"):
            d = Delivery([v2(other.url)], spool_dir=spool, flush_interval=0.05, policy=FAST)
        d.start()
        d.submit([lp(i) for i in range(1000, 1010)])
        assert d.flush(10)
        d.close(2)
        assert other.lines == [lp(i) for i in range(1000, 1010)]  # only its own data
        [held] = d.held
        assert (held.name, held.lines, held.destination) == (
            "influx.held-1",
            202,
            v2(f"http://127.0.0.1:{down}").describe(),
        )
        [warning] = [r.getMessage() for r in caplog.records if "kept, not replayed" in r.getMessage()]
        assert "--replay-spool-to-new-destination" in warning and f"127.0.0.1:{down}" in warning

        again = Delivery([v2(other.url)], spool_dir=spool, flush_interval=0.05, policy=FAST)  # still kept
        assert [h.lines for h in again.held] == [202]
        again.close(0.1)

        moved = Delivery(
            [v2(other.url)], spool_dir=spool, flush_interval=0.05, policy=FAST, replay_spool_elsewhere=True
        )
        assert moved.held == []
        moved.start()
        assert moved.flush(10)
        moved.close(2)
        assert other.lines[10:] == [lp(i) for i in range(202)]
        assert [s.name for s in spool_mod.inspect_spool(spool).sinks] == ["influx"]
    finally:
        other.stop()


def test_a_spool_kept_aside_goes_back_to_its_own_destination(fake, tmp_path):
    spool = tmp_path / "spool"
    port = free_port()
    home = f"http://127.0.0.1:{port}"
    first = Delivery([v2(home)], spool_dir=spool, flush_interval=0.05, policy=FAST)
    first.submit([lp(i) for i in range(30)])
    first.close(0.2)  # never started: everything goes to the spool
    elsewhere = Delivery([v2(fake.url)], spool_dir=spool, flush_interval=0.05, policy=FAST)
    assert [h.lines for h in elsewhere.held] == [30]
    elsewhere.submit([lp(i) for i in range(100, 105)])
    elsewhere.close(0.2)  # the fake is up but the delivery was never started: spooled for the fake

    back = FakeInfluxV2(token=TOKEN, port=port).start()
    try:
        home_again = Delivery([v2(home)], spool_dir=spool, flush_interval=0.05, policy=FAST)
        assert [h.destination for h in home_again.held] == [v2(fake.url).describe()]  # the fake's 5 lines now
        home_again.start()
        assert home_again.flush(10)
        home_again.close(2)
        assert back.lines == [lp(i) for i in range(30)]
    finally:
        back.stop()
