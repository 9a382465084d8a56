"""The v3 sink (``/api/v3/write_lp``) and delivery against InfluxDB 3's stand-in (``support.fake_influx_v3``).

A partial write keeps the good lines on the server: delivery dead-letters only the lines the server
lists, each with its reason, and sends nothing twice. The other answers map to the kinds every sink uses.
"""

from __future__ import annotations

import threading

import pytest
from support.fake_influx_v3 import running

from gpulse.delivery.deadletter import DeadLetter
from gpulse.delivery.retry import RetryPolicy
from gpulse.delivery.sender import BatchSender
from gpulse.influx.connection import Connection
from gpulse.sinks.errors import ErrorKind, WriteError
from gpulse.sinks.factory import build_sinks
from gpulse.sinks.influx_v3 import InfluxV3Sink

TOKEN = "apiv3_admin-token"
T0 = 1_700_000_000_000_000_000
FAST = RetryPolicy(initial=0.01, max_delay=0.02, config_min_delay=0.0)


def lp(i: int, value: str | None = None) -> str:
    return f"gpu,host=h,gpu={i} util={value if value is not None else f'{i}.5'} {T0 + i}\n"


def sender(sink: InfluxV3Sink, tmp_path) -> BatchSender:
    return BatchSender(sink, FAST, DeadLetter(tmp_path / "dead.lp"), stop=threading.Event())


def test_the_agents_connection_builds_a_v3_sink_that_writes_nanoseconds_to_the_database():
    with running(token=TOKEN) as fake:
        conn = Connection(url=fake.url, api="v3", bucket="gpulse", token=TOKEN)
        [sink] = build_sinks(conn, None)
        sink.write([lp(1), lp(2)])
        sink.close()
        rows = fake.engine.rows("gpulse", "gpu")
    assert isinstance(sink, InfluxV3Sink) and sink.describe() == f"InfluxDB 3 API at {fake.url} (database gpulse)"
    assert [r["time"] for r in rows] == [T0 + 1, T0 + 2]  # precision named, not guessed
    assert fake.requests[-1] == ("POST", "/api/v3/write_lp")


def test_a_partial_write_dead_letters_each_bad_line_with_its_reason_and_sends_nothing_twice(tmp_path):
    lines = [lp(i) for i in range(10)]
    lines[3] = lp(3, '"text"')  # a string into the float column util
    lines[7] = "gpu,host=h no-value\n"
    with running(token=TOKEN) as fake:
        sink = InfluxV3Sink(fake.url, TOKEN, "gpulse")
        s = sender(sink, tmp_path)
        result = s.send(lines)
        sink.close()
        stored = fake.engine.rows("gpulse", "gpu")
        writes = [r for r in fake.requests if r[1] == "/api/v3/write_lp"]
    assert (result.written, result.rejected, result.requests, len(writes)) == (8, 2, 1, 1)
    assert sorted(r["gpu"] for r in stored) == [str(i) for i in range(10) if i not in (3, 7)]
    dead = (tmp_path / "dead.lp").read_text()
    assert lines[3] in dead and lines[7] in dead and lines[0] not in dead
    assert "line 4: invalid column type for column 'util'" in dead
    assert "partial write of line protocol occurred: line 8:" in dead


def test_an_unknown_token_is_a_configuration_error_explained_for_v3():
    with running(token=TOKEN) as fake:
        sink = InfluxV3Sink(fake.url, "apiv3_wrong", "gpulse", token_source="file t")
        with pytest.raises(WriteError) as e:
            sink.write([lp(1)])
        sink.close()
    assert e.value.kind is ErrorKind.CONFIG and e.value.status == 401
    assert e.value.diagnosis is not None and "refused the credentials (token) from file t" in e.value.diagnosis.detail


def test_a_body_over_the_servers_limit_is_too_large_and_delivery_splits_it(tmp_path):
    lines = [lp(i) for i in range(40)]
    with running(token=TOKEN, max_request_bytes=600) as fake:
        sink = InfluxV3Sink(fake.url, TOKEN, "gpulse")
        with pytest.raises(WriteError) as e:
            sink.write(lines)
        result = sender(sink, tmp_path).send(lines)
        sink.close()
        stored = len(fake.engine.rows("gpulse", "gpu"))
    assert e.value.kind is ErrorKind.TOO_LARGE and e.value.status == 413
    assert (result.written, result.rejected, stored) == (40, 0, 40)


def test_a_line_over_a_schema_limit_is_a_422_partial_write_handled_the_same_way(tmp_path):
    wide = "wide,host=h " + ",".join(f"f{i}=1" for i in range(501)) + f" {T0}\n"  # 500 columns per table
    with running(token=TOKEN) as fake:
        sink = InfluxV3Sink(fake.url, TOKEN, "gpulse")
        with pytest.raises(WriteError) as e:
            sink.write([lp(1), wide])
        result = sender(sink, tmp_path).send([lp(2), wide])
        sink.close()
        stored = sorted(r["gpu"] for r in fake.engine.rows("gpulse", "gpu"))
    assert e.value.status == 422 and e.value.kind is ErrorKind.REJECTED and e.value.bad_lines == (1,)
    assert (result.written, result.rejected, stored) == (1, 1, ["1", "2"])
    assert "exceed number of columns per table limit of 500" in (tmp_path / "dead.lp").read_text()
