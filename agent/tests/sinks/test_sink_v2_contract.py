"""The v2 sink and the retry policy against the documented ``/api/v2/write`` contract.

No InfluxDB 2 runs in CI, so ``support.fake_influx_v2.FakeInfluxV2`` stands in for it: a real
HTTP server on 127.0.0.1 that checks the token, org, bucket, precision and gzip, parses lines,
answers every documented code, and stores what it accepts. The client side is gpulse's own sink on
``gpulse.influx.http``; one test proves its request is the one InfluxData's own ``influxdb-client``
sends for the same lines. Each test asserts exactly how many lines end written, dead-lettered and spooled.
"""

from __future__ import annotations

import email.utils
import itertools
import logging
import time
from pathlib import Path

import pytest
from support.fake_influx_v2 import FakeInfluxV2
from support.waiting import wait_until

from gpulse.delivery.pipeline import Delivery
from gpulse.delivery.retry import RetryPolicy
from gpulse.sinks.influx_v2 import InfluxV2Sink

TOKEN = "secret-token"
T0 = 1_700_000_000_000_000_000
FAST = RetryPolicy(initial=0.02, max_delay=0.1, config_min_delay=0.0)


def lp(i: int, m: str = "m", value: str | None = None) -> str:
    return f"{m},host=h v={value if value is not None else f'{i}i'} {T0 + i}\n"


@pytest.fixture
def fake():
    server = FakeInfluxV2(token=TOKEN).start()
    yield server
    server.stop()


def delivery(fake: FakeInfluxV2, tmp_path: Path, *, token: str = TOKEN, timeout_s: float = 5.0, **kw) -> Delivery:
    kw.setdefault("flush_interval", 0.1)
    kw.setdefault("policy", FAST)
    sink = InfluxV2Sink(fake.url, token, "gpulse", "gpulse", timeout_s=timeout_s)
    d = Delivery([sink], spool_dir=tmp_path / "spool", **kw)
    d.start()
    return d


def dead_letters(tmp_path: Path) -> list[str]:
    p = tmp_path / "spool" / "dead-letter.lp"
    return p.read_text().splitlines(keepends=True) if p.exists() else []


def wait_for(cond, timeout: float = 10.0) -> None:
    wait_until(cond, timeout, every=0.01)


def test_batches_arrive_in_order_gzipped_with_token_org_bucket_and_ns_precision(fake, tmp_path):
    # flush() cuts; the long interval is the tolerance for "nothing spooled": a batch is spooled once it
    # has waited one interval (the SIGKILL bound), which a 0.1 s interval on a loaded machine reaches
    d = delivery(fake, tmp_path, max_lines=500, flush_interval=5.0)
    lines = [lp(i) for i in range(1200)]
    assert d.submit(lines) == 1200
    assert d.flush(10)
    d.close(5)
    assert fake.lines == lines
    assert [r.lines for r in fake.requests] == [500, 500, 200]
    for r in fake.requests:
        assert r.gzip and r.headers["Authorization"] == f"Token {TOKEN}"
        assert r.params == {"org": "gpulse", "bucket": "gpulse", "precision": "ns"}
    s = d.stats()
    assert (s["lines_written"], s["lines_spooled"], s["lines_rejected"], s["lines_dropped"]) == (1200, 0, 0, 0)
    assert d.durable_upto == 1200
    assert s["last_write_unix"] is not None and s["write_latency_ms"] > 0


def test_the_write_request_is_the_one_influxdatas_own_client_sends(fake):
    """Same lines through gpulse's sink and through ``influxdb-client`` (the reference, in the test extra only):
    the same endpoint, parameters, credentials, encoding and body, and nothing but one request each."""
    from influxdb_client import InfluxDBClient, WritePrecision
    from influxdb_client.client.write_api import SYNCHRONOUS

    lines = [lp(i) for i in range(3)] + ['m,host=h\\ x s="é \\"q\\"" 7\n']
    sink = InfluxV2Sink(fake.url, TOKEN, "gpulse", "gpulse")
    sink.write(lines)
    sink.close()
    with InfluxDBClient(url=fake.url, token=TOKEN, org="gpulse", enable_gzip=True) as client:
        client.write_api(write_options=SYNCHRONOUS).write(
            bucket="gpulse", org="gpulse", record="".join(lines).encode(), write_precision=WritePrecision.NS
        )
    ours, theirs = fake.requests
    assert ours.status == theirs.status == 204
    assert ours.params == theirs.params == {"org": "gpulse", "bucket": "gpulse", "precision": "ns"}
    for header in ("Authorization", "Content-Encoding", "Accept"):
        assert ours.headers[header] == theirs.headers[header], header
    assert ours.headers["Content-Type"].split(";")[0] == theirs.headers["Content-Type"] == "text/plain"
    assert ours.gzip and fake.lines == lines + lines


def test_batches_are_cut_by_bytes_and_by_the_flush_interval(fake, tmp_path):
    d = delivery(fake, tmp_path, max_bytes=1000, flush_interval=0.2)
    lines = [lp(i) for i in range(100)]  # 34-35 bytes each
    d.submit(lines)
    assert d.flush(10)
    assert fake.lines == lines
    at = 0
    for r in fake.requests:  # each batch is as large as fits in 1000 bytes, and no larger
        size = sum(map(len, lines[at : at + r.lines]))
        assert size <= 1000
        assert at + r.lines == len(lines) or size + len(lines[at + r.lines]) > 1000
        at += r.lines
    n = len(fake.requests)
    d.submit([lp(1000)])  # one line, no flush(): the interval delivers it
    wait_for(lambda: len(fake.lines) == 101, timeout=2.0)
    assert len(fake.requests) == n + 1
    d.close(5)


def test_a_malformed_line_named_by_a_400_is_dead_lettered_and_the_rest_written(fake, tmp_path):
    d = delivery(fake, tmp_path, flush_interval=5.0)
    lines = [lp(i) for i in range(10)] + ["m,host=h 12345\n"] + [lp(i) for i in range(10, 20)]
    d.submit(lines)
    assert d.flush(10)
    d.close(5)
    assert fake.statuses() == [400, 204]  # the server named line 11: no bisection needed
    assert sorted(fake.points.values()) == sorted(lines[:10] + lines[11:])
    dl = dead_letters(tmp_path)
    assert dl[1:] == ["m,host=h 12345\n"]
    assert dl[0].startswith("# gpulse dead letter") and "HTTP 400" in dl[0] and "unable to parse" in dl[0]
    s = d.stats()
    assert (s["lines_written"], s["lines_rejected"], s["lines_spooled"]) == (20, 1, 0)


@pytest.mark.parametrize("status", [422, 500])
def test_type_conflicts_are_isolated_and_dead_lettered_never_retried(fake, tmp_path, status):
    fake.conflict_status = status  # 422 partial write (2.x); 500 "field type conflict" (2.0.x)
    d = delivery(fake, tmp_path, flush_interval=5.0)  # flush() cuts; the long interval keeps it all in memory
    d.submit([lp(0)])  # v is an integer from now on
    assert d.flush(10)
    bad = {5, 17, 18}
    lines = [lp(i, value=f"{i}.5" if i in bad else None) for i in range(1, 30)]
    d.submit(lines)
    assert d.flush(10)
    d.close(5)
    rejected = [x for x in dead_letters(tmp_path) if not x.startswith("#")]
    assert sorted(rejected) == sorted(lp(i, value=f"{i}.5") for i in bad)
    assert all(
        f"HTTP {status}" in x and "field type conflict" in x for x in dead_letters(tmp_path) if x.startswith("#")
    )
    assert len(fake.points) == 30 - len(bad)
    s = d.stats()
    assert (s["lines_written"], s["lines_rejected"], s["lines_spooled"]) == (30 - len(bad), len(bad), 0)
    # bisection: every request after the first conflict holds strictly fewer lines than the one it split
    assert len(fake.requests) < 2 * 29


def test_413_splits_batches_in_halves_and_dead_letters_a_single_line_that_never_fits(fake, tmp_path):
    """Covers a proxy in front of InfluxDB, or InfluxDB Cloud: OSS 2.9.1 sets no size limit on writes."""
    fake.max_body_bytes = 2000
    d = delivery(fake, tmp_path, max_lines=5000, flush_interval=5.0)
    huge = f'm,host=h s="{"x" * 3000}" {T0 + 999}\n'
    lines = [lp(i) for i in range(200)]
    d.submit(lines[:100] + [huge] + lines[100:])
    assert d.flush(10)
    d.close(5)
    assert fake.lines == lines  # in order, each exactly once
    assert 413 in fake.statuses()
    assert [x for x in dead_letters(tmp_path) if not x.startswith("#")] == [huge]
    s = d.stats()
    assert (s["lines_written"], s["lines_rejected"], s["lines_spooled"]) == (200, 1, 0)


@pytest.mark.parametrize("status", [401, 403, 404])
def test_configuration_errors_keep_the_data_log_once_and_deliver_after_the_fix(fake, tmp_path, caplog, status):
    good = fake.token
    if status == 401:
        fake.token = "another-token"
    elif status == 403:
        fake.token, fake.forbidden_tokens = "another-token", {TOKEN}
    else:
        fake.buckets = {"elsewhere"}
    caplog.set_level(logging.WARNING, logger="gpulse")
    d = delivery(fake, tmp_path)
    d.submit([lp(i) for i in range(50)])
    wait_for(lambda: fake.statuses().count(status) >= 5)
    assert d.durable_upto == 50  # spooled: the training channel may ack
    assert d.stats()["lines_spooled"] == 50 and d.stats()["lines_written"] == 0 and fake.lines == []
    loud = [r for r in caplog.records if "CONFIGURATION ERROR" in r.getMessage()]
    assert len(loud) == 1 and f"HTTP {status}" in loud[0].getMessage() and TOKEN not in loud[0].getMessage()
    fake.token, fake.forbidden_tokens, fake.buckets = good, set(), {"gpulse"}
    assert d.flush(10)
    d.close(5)
    assert fake.lines == [lp(i) for i in range(50)]
    s = d.stats()
    assert (s["lines_written"], s["lines_replayed"], s["lines_rejected"], s["spool_bytes"]) == (50, 50, 0, 0)


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_pauses_the_sink_for_retry_after_seconds(fake, tmp_path, status):
    """Covers a proxy in front of InfluxDB, or InfluxDB Cloud: OSS 2.9.1 never answers a write 429 or Retry-After."""
    d = delivery(fake, tmp_path)
    fake.push(status, headers={"Retry-After": "1"})
    d.submit([lp(i) for i in range(10)])
    assert d.flush(10)
    d.close(5)
    assert fake.statuses() == [status, 204]
    gap = fake.requests[1].at - fake.requests[0].at
    assert 0.95 <= gap < 3.0  # honoured, not the 20 ms backoff
    assert d.stats()["lines_written"] == 10


def test_retry_after_as_an_http_date_is_honoured(fake, tmp_path):
    """Covers a proxy in front of InfluxDB, or InfluxDB Cloud: OSS 2.9.1 never sends Retry-After."""
    d = delivery(fake, tmp_path)
    fake.push(503, headers={"Retry-After": email.utils.formatdate(time.time() + 2, usegmt=True)})
    d.submit([lp(i) for i in range(10)])
    assert d.flush(10)
    d.close(5)
    gap = fake.requests[1].at - fake.requests[0].at
    assert 0.95 <= gap <= 3.0  # 1-second date resolution: between 1 and 2 s
    assert d.stats()["lines_written"] == 10


def test_server_errors_are_retried_with_backoff_until_written(fake, tmp_path):
    d = delivery(fake, tmp_path)
    (sender,) = [w.sender for w in d.workers]
    told, delays = sender.on_retry, []
    sender.on_retry = lambda error, delay: (delays.append(delay), told and told(error, delay))
    fake.push(500, times=3)
    d.submit([lp(i) for i in range(10)])
    assert d.flush(10)
    d.close(5)
    assert fake.statuses() == [500, 500, 500, 204]
    # full jitter: retry n waits uniformly in [0, min(max_delay, initial * 2^(n-1))], and the wait is kept
    assert [0 <= w <= min(FAST.max_delay, FAST.initial * 2**n) for n, w in enumerate(delays)] == [True] * 3, delays
    gaps = [b.at - a.at for a, b in itertools.pairwise(fake.requests)]
    assert all(g >= w - 0.001 for g, w in zip(gaps, delays, strict=True)), (gaps, delays)
    s = d.stats()
    assert (s["lines_written"], s["lines_spooled"], s["lines_replayed"]) == (10, 10, 10)


def test_slow_answers_time_out_and_are_retried_without_losing_or_duplicating_points(fake, tmp_path):
    d = delivery(fake, tmp_path, timeout_s=0.3)
    fake.push(0, delay_s=1.0)  # the first answer comes after the client gave up
    d.submit([lp(i) for i in range(10)])
    assert d.flush(10)
    d.close(5)
    assert sorted(fake.points.values()) == sorted(lp(i) for i in range(10))
    assert d.stats()["lines_written"] == 10


def test_a_request_slower_than_the_flush_interval_gets_its_batch_spooled(fake, tmp_path):
    """The SIGKILL bound: nothing handed to a sink waits in memory longer than one flush interval."""
    d = delivery(fake, tmp_path, flush_interval=0.2, timeout_s=10)
    fake.push(0, delay_s=1.5)
    d.submit([lp(i) for i in range(10)])
    wait_for(lambda: d.durable_upto == 10, timeout=1.0)
    assert fake.lines == [] and d.stats()["lines_spooled"] == 10  # still in flight, but safe on disk
    assert d.flush(10)
    d.close(5)
    assert fake.lines == [lp(i) for i in range(10)]
    s = d.stats()
    assert (s["lines_written"], s["spool_bytes"]) == (10, 0)


def test_an_outage_spools_new_data_and_replays_it_in_order_while_data_keeps_flowing(fake, tmp_path):
    port = int(fake.url.rsplit(":", 1)[1])
    d = delivery(fake, tmp_path)
    d.submit([lp(i) for i in range(100)])
    assert d.flush(10)
    fake.stop()
    for k in range(1, 6):  # five flush intervals of data while the database is gone
        d.submit([lp(100 * k + i) for i in range(100)])
        time.sleep(0.1)
    wait_for(lambda: d.durable_upto == 600)
    assert d.stats()["lines_spooled"] >= 500
    back = FakeInfluxV2(token=TOKEN, port=port).start()
    try:
        d.submit([lp(600 + i) for i in range(100)])
        assert d.flush(15)
        d.close(5)
        assert back.lines == [lp(i) for i in range(100, 700)]  # every line once, in submission order
    finally:
        back.stop()
    s = d.stats()
    assert s["lines_written"] == 700 and s["lines_dropped"] == 0 and s["spool_bytes"] == 0
