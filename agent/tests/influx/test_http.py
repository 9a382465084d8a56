"""The one HTTP client: a total deadline whatever the server does, bounded answers, a close that never blocks.

The servers here misbehave on purpose (``support/rawhttp.py``): they trickle, flood, or never answer.
The well-behaved paths run against the real InfluxDB 1.x.
"""

from __future__ import annotations

import gzip
import json
import ssl
import subprocess
import threading
import time

import pytest
from support.influxd import free_port
from support.rawhttp import RawHTTPServer, head, huge_body, respond, silent, trickle_body, trickle_headers

from gpulse.influx.http import (
    Failure,
    HttpClient,
    HTTPStatusError,
    TransportError,
    basic_auth,
    error_message,
    parse_url,
    token_auth,
)


def test_a_body_trickled_one_byte_at_a_time_ends_at_the_total_deadline():
    # a byte every 0.2 s keeps every per-receive timeout happy; only a total deadline ends it
    with RawHTTPServer(trickle_body(0.2)) as server:
        client = HttpClient(server.url, timeout_s=1.0)
        t0 = time.monotonic()
        with pytest.raises(TransportError) as e:
            client.request("POST", "/write", body=b"m v=1i 1\n")
        took = time.monotonic() - t0
    assert e.value.failure is Failure.TIMEOUT and "within 1 s" in str(e.value)
    assert 0.9 <= took < 2.5
    assert server.sent >= len(head("200 OK", 1000)) + 3  # it was sending, slowly, when the deadline cut it


@pytest.mark.parametrize("behaviour", [trickle_headers(0.1), silent], ids=["trickled-headers", "no-answer"])
def test_headers_trickled_or_never_sent_end_at_the_total_deadline(behaviour):
    with RawHTTPServer(behaviour) as server:
        t0 = time.monotonic()
        with pytest.raises(TransportError) as e:
            HttpClient(server.url, timeout_s=1.0).request("GET", "/ping")
        assert time.monotonic() - t0 < 2.5
    assert e.value.failure is Failure.TIMEOUT


def test_a_huge_answer_is_read_up_to_the_cap_and_its_connection_dropped():
    with RawHTTPServer(huge_body(400 * 1024 * 1024)) as server:
        client = HttpClient(server.url, timeout_s=10, max_body=64 * 1024)
        r = client.request("POST", "/write", body=b"m v=1i 1\n")
        assert r.status == 200 and r.truncated and len(r.body) == 64 * 1024
        r = client.request("POST", "/write", body=b"m v=1i 1\n")  # a fresh connection: the old one was cut
        time.sleep(0.2)
    assert server.connections == 2
    assert server.sent < 100 * 1024 * 1024  # the server stopped long before its 400 MB
    with pytest.raises(ValueError, match="larger"):
        r.json()


def test_a_json_answer_larger_than_asked_for_is_an_error_not_a_half_document():
    with RawHTTPServer(huge_body(10 * 1024 * 1024)) as server, HttpClient(server.url) as client:
        with pytest.raises(TransportError) as e:
            client.get_json("/api/v2/tasks", max_body=1024)
    assert e.value.failure is Failure.BROKEN and "with more than 1024 bytes" in str(e.value)


def test_close_from_another_thread_aborts_the_request_in_flight_at_once():
    with RawHTTPServer(silent) as server:
        client = HttpClient(server.url, timeout_s=30)
        failure: list[TransportError] = []

        def call() -> None:
            try:
                client.request("POST", "/write", body=b"x")
            except TransportError as e:
                failure.append(e)

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        client.close()
        assert time.monotonic() - t0 < 0.1  # close never waits for the request
        t.join(2)
        assert not t.is_alive()
    assert failure and failure[0].failure is Failure.CLOSED
    with pytest.raises(TransportError) as e:
        client.request("GET", "/ping")  # closed is closed
    assert e.value.failure is Failure.CLOSED


def test_nothing_listening_is_refused_at_once_and_says_so():
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(TransportError) as e:
        HttpClient(url).request("GET", "/ping")
    assert time.monotonic() - t0 < 1.0
    assert e.value.failure is Failure.REFUSED
    assert str(e.value) == f"cannot reach {url}: Connection refused (nothing listens there)"


def test_an_answer_cut_short_is_an_error_not_a_short_body():
    def cut(sock, req, server):
        server.send(sock, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        return False

    with RawHTTPServer(cut) as server:
        with pytest.raises(TransportError) as e:
            HttpClient(server.url).request("GET", "/query")
    assert e.value.failure is Failure.BROKEN and "IncompleteRead" in str(e.value)


def test_one_keep_alive_connection_serves_many_requests_and_a_closed_one_is_replaced():
    with RawHTTPServer(respond()) as server:
        client = HttpClient(server.url)
        for _ in range(5):
            assert client.request("POST", "/write", body=b"m v=1i 1\n").status == 204
        assert server.connections == 1
        for s in list(server._socks):  # the server drops idle connections (a restart, a proxy's idle timeout)
            s.shutdown(2)
        time.sleep(0.1)
        assert client.request("POST", "/write", body=b"m v=1i 1\n").status == 204
        assert server.connections == 2
        client.close()


def test_requests_carry_auth_gzip_json_and_parameters():
    with RawHTTPServer(respond("200 OK", b'{"id": "b1"}', "Content-Type: application/json\r\n")) as server:
        with HttpClient(server.url + "/influx", authorization=token_auth("s3cret")) as client:
            doc = client.post_json("/api/v2/buckets", {"name": "gpulse"}, params={"orgID": "o1"})
            client.request("POST", "/api/v2/write", params={"bucket": "b"}, body=b"m v=1i 1\n", gzip=True)
        assert repr(client) == f"HttpClient('{server.url}/influx')"  # never the token
    assert doc == {"id": "b1"}
    first, second = server.requests
    assert (first.method, first.path) == ("POST", "/influx/api/v2/buckets?orgID=o1")
    assert first.headers["authorization"] == "Token s3cret"
    assert first.headers["content-type"] == "application/json; charset=utf-8"
    assert json.loads(first.body) == {"name": "gpulse"}
    assert second.headers["content-encoding"] == "gzip" and gzip.decompress(second.body) == b"m v=1i 1\n"
    assert basic_auth("admin", "pw") == "Basic YWRtaW46cHc="


def test_a_refusal_is_an_answer_and_the_json_helpers_raise_it_with_the_servers_words():
    body = b'{"code":"not found","message":"bucket \\"x\\" not found"}'
    with RawHTTPServer(respond("404 Not Found", body)) as server, HttpClient(server.url) as client:
        r = client.request("GET", "/api/v2/buckets")
        assert (r.status, r.ok, r.message()) == (404, False, 'bucket "x" not found')
        with pytest.raises(HTTPStatusError) as e:
            client.get_json("/api/v2/buckets")
    assert e.value.status == 404 and str(e.value) == 'HTTP 404: bucket "x" not found'


def test_every_influxdb_error_shape_reads_the_same_way():
    assert error_message({}, b'{"code":"invalid","message":"bad"}') == "bad"  # 2.x
    assert error_message({}, b'{"error":"database not found: \\"x\\""}') == 'database not found: "x"'  # 1.x
    assert error_message({"X-Influxdb-Error": "timeout"}, b"") == "timeout"
    assert error_message({}, b"<html> 502   Bad\nGateway </html>") == "<html> 502 Bad Gateway </html>"
    assert error_message({}, b"") == "(no message)"


@pytest.mark.parametrize("url", ["http://admin:pw@127.0.0.1:8086", "https://token@example.com", "http://admin:pw@"])
def test_credentials_in_a_url_are_refused_without_echoing_them(url):
    with pytest.raises(ValueError) as e:
        parse_url(url)
    assert "--token-file" in str(e.value) and "pw" not in str(e.value) and "token@" not in str(e.value)


@pytest.fixture(scope="module")
def tls_server_context(tmp_path_factory) -> ssl.SSLContext:
    """A self-signed certificate for 127.0.0.1 (openssl), loaded into a server context."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "cert.pem", d / "key.pem")
    return ctx


def test_tls_is_verified_unless_told_not_to_and_the_deadline_holds_under_tls(tls_server_context):
    with RawHTTPServer(respond(), tls=tls_server_context) as server:
        with pytest.raises(TransportError) as e:
            HttpClient(server.url).request("GET", "/ping")
        assert e.value.failure is Failure.TLS and "CERTIFICATE_VERIFY_FAILED" in str(e.value)
        with HttpClient(server.url, verify_tls=False) as client:
            assert client.request("GET", "/ping").status == 204
    with RawHTTPServer(trickle_body(0.2), tls=tls_server_context) as server:
        t0 = time.monotonic()
        with pytest.raises(TransportError) as e:
            HttpClient(server.url, timeout_s=1.0, verify_tls=False).request("GET", "/ping")
        assert time.monotonic() - t0 < 2.5
    assert e.value.failure is Failure.TIMEOUT


def test_the_real_influxdb_answers_through_it(influxdb_module):
    with HttpClient(influxdb_module.url) as client:
        ping = client.request("GET", "/ping")
        assert ping.status == 204 and ping.header("X-Influxdb-Version").startswith("1.")
        w = client.request("POST", "/write", params={"db": "gpulse"}, body=b"http_test v=1i 1000\n", gzip=True)
        assert w.status == 204, w.message()
        q = client.call("GET", "/query", params={"db": "gpulse", "q": "SELECT v FROM http_test"})
    assert q["results"][0]["series"][0]["values"] == [["1970-01-01T00:00:00.000001Z", 1]]


#: Modules still on influxdb-client, each moving onto gpulse.influx.http in its owner's branch
#: (setup v2's admin calls; doctor's and agent --check's v2 bucket, org, DBRP and task lookups).
PENDING_MIGRATION = {"gpulse.influx.setup.v2", "gpulse.cli.doctor", "gpulse.cli.agent_check"}


def test_gpulse_speaks_http_through_one_client_and_not_influxdb_client():
    """influxdb-client is no runtime dependency (it is in the test extra, for the benchmarks): no new module may import it."""
    import ast
    from pathlib import Path

    import gpulse

    root = Path(gpulse.__file__).parent
    users = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(n.split(".")[0] in ("influxdb_client", "urllib3") or n == "urllib.request" for n in names):
                users.add(".".join(path.relative_to(root.parent).with_suffix("").parts))
    assert users <= PENDING_MIGRATION, sorted(users - PENDING_MIGRATION)
