"""The v1 sink (``/write?db=&rp=&precision=n``, gzip, Basic auth) against a real InfluxDB 1.x."""

from __future__ import annotations

import time

import pytest
from support.influxd import InfluxDB1

from gpulse.delivery.pipeline import Delivery
from gpulse.delivery.retry import RetryPolicy
from gpulse.influx.http import gzip_body
from gpulse.sinks.base import encode_body
from gpulse.sinks.influx_v1 import InfluxV1Sink

FAST = RetryPolicy(initial=0.05, max_delay=0.2, config_min_delay=0.0)
T0 = 1_700_000_000_000_000_000


def lp(i: int, m: str = "m", value: str | None = None) -> str:
    return f"{m},host=h v={value if value is not None else f'{i}i'} {T0 + i * 1000}\n"


def values(server: InfluxDB1, m: str, db: str = "gpulse") -> list[int]:
    return [r["v"] for r in server.rows(f'SELECT v FROM "{m}"', db=db)]


def delivery(server: InfluxDB1, tmp_path, bucket: str = "gpulse", **kw) -> Delivery:
    db, _, rp = bucket.partition("/")
    kw.setdefault("flush_interval", 0.1)
    d = Delivery([InfluxV1Sink(server.url, db, rp, timeout_s=5)], spool_dir=tmp_path / "spool", policy=FAST, **kw)
    d.start()
    return d


def test_every_line_is_written_exactly_once(influxdb_module, tmp_path):
    """Whichever way each batch goes: from memory, or through the spool once it has waited a flush
    interval (the database answers slower than 0.1 s on a loaded machine). The database cannot show a
    duplicate (same series and time overwrite), so the counts do."""
    d = delivery(influxdb_module, tmp_path, max_lines=1000)
    for k in range(12):
        d.submit([lp(1000 * k + i, "exact") for i in range(1000)])
    assert d.flush(20)
    d.close(5)
    assert influxdb_module.count("exact", "v") == 12_000
    assert values(influxdb_module, "exact") == list(range(12_000))
    s = d.stats()
    assert (s["lines_written"], s["lines_rejected"], s["lines_dropped"], s["spool_bytes"]) == (12_000, 0, 0, 0)
    assert s["lines_replayed"] == s["lines_spooled"]  # each spooled line sent once, from the spool


def test_a_retention_policy_in_the_bucket_is_used(influxdb_module, tmp_path):
    influxdb_module.query('CREATE RETENTION POLICY "short" ON "gpulse" DURATION 1000w REPLICATION 1')
    d = delivery(influxdb_module, tmp_path, bucket="gpulse/short")
    d.submit([lp(i, "rp") for i in range(10)])
    assert d.flush(10)
    d.close(5)
    assert len(influxdb_module.rows('SELECT v FROM "gpulse"."short"."rp"')) == 10
    assert influxdb_module.rows('SELECT v FROM "gpulse"."autogen"."rp"') == []


def test_rejected_lines_are_dead_lettered_and_the_others_written(influxdb_module, tmp_path):
    """A real 1.x answers 400 for both: "unable to parse" (naming the line) and "field type conflict"."""
    d = delivery(influxdb_module, tmp_path, flush_interval=5.0)
    d.submit([lp(0, "rej")])
    assert d.flush(10)
    lines = [lp(i, "rej") for i in range(1, 21)]
    lines[4] = lp(5, "rej", value="5.5")  # type conflict: v is an integer
    lines[9] = "rej,host=h\n"  # unparseable: no fields
    lines[14] = lp(15, "rej", value="15.5")
    d.submit(lines)
    assert d.flush(10)
    d.close(5)
    dead = (tmp_path / "spool" / "dead-letter.lp").read_text().splitlines(keepends=True)
    assert sorted(x for x in dead if not x.startswith("#")) == sorted([lines[4], lines[9], lines[14]])
    reasons = " ".join(x for x in dead if x.startswith("#"))
    assert "field type conflict" in reasons and "unable to parse" in reasons
    assert values(influxdb_module, "rej") == [i for i in range(21) if i not in (5, 10, 15)]
    s = d.stats()
    assert (s["lines_written"], s["lines_rejected"]) == (18, 3)


def test_a_missing_database_is_a_configuration_error_and_nothing_is_lost(influxdb_module, tmp_path):
    d = delivery(influxdb_module, tmp_path, bucket="later")
    d.submit([lp(i, "cfg") for i in range(50)])
    deadline = time.monotonic() + 10
    while d.workers[0].retries < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert d.durable_upto == 50 and d.stats()["lines_written"] == 0
    influxdb_module.create_database("later")
    assert d.flush(10)
    d.close(5)
    assert values(influxdb_module, "cfg", db="later") == list(range(50))


def test_a_database_outage_is_spooled_and_replayed_in_full(influxdb, tmp_path):
    d = delivery(influxdb, tmp_path)
    n = 0
    for _ in range(5):
        d.submit([lp(n + i, "outage") for i in range(200)])
        n += 200
        time.sleep(0.05)
    assert d.flush(10)
    influxdb.stop()
    for _ in range(10):  # a second of samples while the database is down
        d.submit([lp(n + i, "outage") for i in range(200)])
        n += 200
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while d.durable_upto != n:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert d.stats()["lines_spooled"] >= 1800
    influxdb.start()
    for _ in range(5):  # and more while the backlog replays
        d.submit([lp(n + i, "outage") for i in range(200)])
        n += 200
        time.sleep(0.05)
    assert d.flush(30)
    d.close(5)
    assert values(influxdb, "outage") == list(range(n))
    s = d.stats()
    assert (s["lines_written"], s["lines_dropped"], s["spool_bytes"]) == (n, 0, 0)
    assert s["lines_replayed"] >= 1800


@pytest.fixture
def small_influxdb(tmp_path_factory):
    server = InfluxDB1(tmp_path_factory.mktemp("influxd-small"), max_body_size=4000).start()
    server.create_database("gpulse")
    yield server
    server.stop()


def test_413_from_a_real_server_splits_the_batch(small_influxdb, tmp_path):
    d = delivery(small_influxdb, tmp_path, flush_interval=5.0)
    # random-looking tags compress badly, so the gzipped body exceeds the 4000-byte limit
    lines = [f"big,host=h{(i * 2654435761) % 1000003:x} v={i}i {T0 + i}\n" for i in range(2000)]
    assert len(gzip_body(encode_body(lines))) > 4 * 4000  # one request cannot pass
    d.submit(lines)
    assert d.flush(20)
    d.close(5)
    assert small_influxdb.count("big", "v") == 2000
    s = d.stats()
    assert (s["lines_written"], s["lines_rejected"]) == (2000, 0)
