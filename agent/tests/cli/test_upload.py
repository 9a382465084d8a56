"""``gpulse upload`` pushes recordings into a real InfluxDB 1.x: validated, idempotent, and honest about bad lines.

What will not get better fails at once and says what to do (issue 14, item 2: before, a closed port
printed 15 retry warnings over 300 s and a missing retention policy was retried until the deadline);
each advice it prints is followed here and works.
"""

from __future__ import annotations

import http.client
import os
import pty
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1, free_port
from support.rawhttp import RawHTTPServer, RawRequest, head, respond, silent

from gpulse.cli.commands.upload import MAY_HEAL, WILL_NOT_HEAL
from gpulse.lineprotocol.encode import Encoder

TAGS = {"run": "up1", "rank": "0", "local_rank": "0", "world_size": "1", "host": "node1"}


def recording(n: int, run: str = "up1", t0: int | None = None) -> str:
    enc = Encoder()
    t0 = t0 or time.time_ns() - 10**9 * 60
    lines = [
        enc.encode(
            "train_step",
            {**TAGS, "run": run},
            {"step": i, "step_time_s": 0.1, "log_loss": 1.0 / (i + 1)},
            t0 + i * 10**6,
        )
        for i in range(n)
    ]
    lines.append(
        enc.encode(
            "gpu",
            {"host": "node1", "gpu": "0", "uuid": "GPU-0", "model": "Sim", "run": run},
            {"util_gpu_pct": 50.0},
            t0,
        )
    )
    return "".join(lines)


def upload(influxdb, clean_env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        gpulse_cmd("upload", "--url", influxdb.url, "--api", "v1", "--bucket", "gpulse", *args),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_uploading_the_same_file_twice_creates_no_duplicates(tmp_path: Path, influxdb_module, clean_env):
    f = tmp_path / "gpulse-records.rec"
    f.write_text(recording(250))
    for _ in range(2):
        res = upload(influxdb_module, clean_env, str(f))
        assert res.returncode == 0, res.stderr
        assert "uploaded 251 lines" in res.stdout and "0 invalid" in res.stdout
    assert influxdb_module.count("train_step", "step", where="\"run\" = 'up1'") == 250
    assert influxdb_module.count("gpu", "util_gpu_pct", where="\"run\" = 'up1'") == 1


def test_bad_lines_are_named_by_line_number_and_never_sent(tmp_path: Path, influxdb_module, clean_env):
    good = recording(3, run="up2").splitlines(keepends=True)
    f = tmp_path / "mixed.lp"
    f.write_text(
        good[0]
        + "train_step,host=h,run=up2,rank=0 step=1.5 1\n"  # float for the int field step
        + "nonsense here\n"
        + good[1]
        + "train_step,host=h,run=up2,rank=0 step=7i\n"  # no timestamp: would duplicate on re-upload
        + "mystery,host=h value=1 1\n"
        + good[2]
        + good[3]
        + "train_step,host=h,run=up2,rank=0 step=9i 17"  # torn last line (no newline)
    )
    res = upload(influxdb_module, clean_env, str(f))
    assert res.returncode == 3, res.stderr
    reported = {int(line.split(":")[1]): line for line in res.stderr.splitlines() if line.startswith(f"{f}:")}
    expected = {
        2: "'step' is float, the schema says int",
        3: "no '='",
        5: "no timestamp",
        6: "unknown measurement",
        9: "no newline",
    }
    assert sorted(reported) == sorted(expected)
    for lineno, why in expected.items():
        assert why in reported[lineno]
    assert "uploaded 4 lines" in res.stdout and "5 invalid lines skipped" in res.stdout
    assert influxdb_module.count("train_step", "step", where="\"run\" = 'up2'") == 3
    assert influxdb_module.count("mystery", "value") == 0


def test_dry_run_checks_without_sending(tmp_path: Path, influxdb_module, clean_env):
    f = tmp_path / "dry.lp"
    f.write_text(recording(5, run="up3"))
    res = upload(influxdb_module, clean_env, "--dry-run", str(f))
    assert res.returncode == 0 and "6 valid lines, 0 invalid" in res.stdout
    assert influxdb_module.count("train_step", "step", where="\"run\" = 'up3'") == 0


def test_an_unreachable_database_fails_with_status_1_and_a_missing_file_is_a_config_error(tmp_path: Path, clean_env):
    f = tmp_path / "r.lp"
    f.write_text(recording(2, run="up4"))
    res = subprocess.run(
        gpulse_cmd("upload", "--url", "http://127.0.0.1:9", "--api", "v1", "--deadline", "1", str(f)),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 1 and "3 not delivered" in res.stdout
    res = subprocess.run(
        gpulse_cmd("upload", str(tmp_path / "nope.lp")), env=clean_env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "is not a file" in res.stderr


def run_upload(clean_env, *args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    res = subprocess.run(gpulse_cmd("upload", *args), env=clean_env, capture_output=True, text=True, timeout=timeout)
    return res, time.monotonic() - t0


def test_nothing_listening_fails_at_once_and_the_advised_url_works(tmp_path: Path, influxdb_module, clean_env):
    f = tmp_path / "r.lp"
    f.write_text(recording(193, run="up5"))
    url = f"http://127.0.0.1:{free_port()}"
    res, took = run_upload(clean_env, "--url", url, "--api", "v1", str(f))
    assert res.returncode == 1 and took < 10  # before: 300 s of retries
    assert f"gpulse upload: cannot reach {url}: Connection refused (nothing listens there)" in res.stderr
    assert "point gpulse at yours with --url" in res.stderr and "Nothing was sent." in res.stderr
    assert "WARNING" not in res.stderr and "194 not delivered" in res.stdout
    res, _ = run_upload(clean_env, "--url", influxdb_module.url, "--api", "v1", str(f))  # the advice, followed
    assert res.returncode == 0 and "uploaded 194 lines" in res.stdout, res.stderr


def test_a_missing_retention_policy_is_a_layout_error_at_the_first_answer(tmp_path: Path, influxdb_module, clean_env):
    f = tmp_path / "r.lp"
    f.write_text(recording(20, run="up6"))
    base = ("--url", influxdb_module.url, "--api", "v1")
    res, took = run_upload(clean_env, *base, "--bucket", "gpulse/nosuchrp", str(f))
    assert res.returncode == 1 and took < 10  # before: HTTP 500 retried until the 300 s deadline
    assert "retention policy 'nosuchrp' does not exist on database 'gpulse'" in res.stderr
    assert "(HTTP 500: retention policy not found: nosuchrp)" in res.stderr
    assert "give --bucket gpulse for the database's default" in res.stderr
    assert "WARNING" not in res.stderr and "21 not delivered" in res.stdout
    res, _ = run_upload(clean_env, *base, "--bucket", "gpulse", str(f))  # the advice, followed
    assert res.returncode == 0 and "uploaded 21 lines" in res.stdout, res.stderr


def test_a_missing_database_says_gpulse_setup_and_gpulse_setup_makes_it(tmp_path: Path, influxdb_module, clean_env):
    f = tmp_path / "r.lp"
    f.write_text(recording(5, run="up7"))
    base = ("--url", influxdb_module.url, "--api", "v1", "--bucket", "fresh")
    res, _ = run_upload(clean_env, *base, str(f))
    assert res.returncode == 1
    assert "database 'fresh' does not exist" in res.stderr
    assert f"run `gpulse setup --url {influxdb_module.url} --api v1 --bucket fresh`" in res.stderr
    setup = subprocess.run(gpulse_cmd("setup", *base), env=clean_env, capture_output=True, text=True, timeout=60)
    assert setup.returncode == 0, setup.stderr
    res, _ = run_upload(clean_env, *base, str(f))
    assert res.returncode == 0 and "uploaded 6 lines" in res.stdout, res.stderr


def test_the_v2_api_against_influxdb_1x_gets_setups_message_and_the_advised_api_works(
    tmp_path: Path, influxdb_module, clean_env
):
    f = tmp_path / "r.lp"
    f.write_text(recording(3, run="up8"))
    token = tmp_path / "token"
    token.write_text("some-token\n")
    token.chmod(0o600)
    res, _ = run_upload(clean_env, "--url", influxdb_module.url, "--token-file", str(token), str(f))
    assert res.returncode == 2  # before: "HTTP 404: 404 page not found"
    assert res.stderr.strip() == (
        f"gpulse upload: configuration error: {influxdb_module.url} is InfluxDB 1.6.7~rc0: "
        "use --api v1 (with --token-file holding user:password)"
    )
    res, _ = run_upload(clean_env, "--url", influxdb_module.url, "--api", "v1", str(f))
    assert res.returncode == 0 and "uploaded 4 lines" in res.stdout, res.stderr


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    server = InfluxDB1(tmp_path_factory.mktemp("influxd-auth"), auth=True).start()
    server.query("CREATE USER admin WITH PASSWORD 'Adm1n-pw' WITH ALL PRIVILEGES")
    server.query('CREATE DATABASE "gpulse"', user=("admin", "Adm1n-pw"))
    yield server
    server.stop()


def test_no_credentials_given_says_so_and_where_they_come_from(tmp_path: Path, auth_server, clean_env):
    f = tmp_path / "r.lp"
    f.write_text(recording(3, run="up9"))
    base = ("--url", auth_server.url, "--api", "v1")
    res, _ = run_upload(clean_env, *base, str(f))
    assert res.returncode == 1
    assert (
        f"InfluxDB at {auth_server.url} asks for credentials and none were given "
        "(no --token-file, GPULSE_TOKEN_FILE, token_file in --config, nor GPULSE_TOKEN)"
    ) in res.stderr
    assert "(HTTP 401: unable to parse authentication credentials)" in res.stderr
    assert "pass --token-file FILE" in res.stderr and "nowhere" not in res.stderr
    creds = tmp_path / "creds"
    creds.write_text("admin:Adm1n-pw\n")
    creds.chmod(0o600)
    res, _ = run_upload(clean_env, *base, "--token-file", str(creds), str(f))
    assert res.returncode == 0 and "uploaded 4 lines" in res.stdout, res.stderr
    assert "Adm1n-pw" not in res.stdout + res.stderr


def test_an_outage_is_retried_until_the_deadline_said_up_front_and_then_given_up(tmp_path: Path, clean_env):
    f = tmp_path / "r.lp"
    f.write_text(recording(3, run="up10"))
    with RawHTTPServer(respond("503 Service Unavailable", b'{"error":"overloaded"}')) as server:
        res, took = run_upload(clean_env, "--url", server.url, "--api", "v1", "--deadline", "2", str(f))
    assert res.returncode == 1 and took < 15
    lines = res.stderr.splitlines()
    assert f"{MAY_HEAL} are retried until" in lines[0] and f"{WILL_NOT_HEAL} stops at once" in lines[0]
    assert "(--deadline 2 s)" in lines[0]
    retries = [x for x in lines if "retrying in" in x]
    # the deadline counts from the start: what the probe took is off the time left for writing
    assert retries and all("HTTP 503: overloaded" in x and re.search(r"\(deadline [12]\.?\d* s\)", x) for x in retries)
    assert "would come after the deadline" in lines[len(retries) + 1]  # no pointless wait for the deadline
    assert "gpulse upload: gave up at the deadline (--deadline 2 s) while retrying: HTTP 503: overloaded" in res.stderr
    assert "Run the same command again" in res.stderr and "4 not delivered" in res.stdout


def test_a_large_upload_shows_a_progress_bar_on_a_terminal(tmp_path: Path, clean_env):
    f = tmp_path / "big.lp"
    f.write_text(recording(20_000, run="up11"))

    def slow(sock, req, server):  # each batch of 5,000 lines takes 0.4 s to be answered
        time.sleep(0.4 if req.path.startswith("/write") else 0)
        return respond()(sock, req, server)

    with RawHTTPServer(slow) as server:
        leader, follower = pty.openpty()
        try:
            proc = subprocess.run(
                gpulse_cmd("upload", "--url", server.url, "--api", "v1", str(f)),
                env=clean_env, stdout=subprocess.PIPE, stderr=follower, text=True, timeout=60,
            )  # fmt: skip
            os.close(follower)
            screen = b""
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                screen += chunk
        finally:
            os.close(leader)
    assert proc.returncode == 0 and "uploaded 20001 lines" in proc.stdout
    frames = screen.decode().split("\r")
    bars = [x for x in frames if x.startswith("gpulse upload: [")]
    assert len(bars) >= 2, screen
    assert "of 20,001 lines" in bars[0] and bars[-1].startswith("gpulse upload: [########################] 20,001")


def test_progress_in_a_log_is_one_line_every_ten_seconds_and_nothing_for_short_work():
    import io

    from gpulse.util.progress import Progress

    now = [0.0]
    out = io.StringIO()
    p = Progress(1000, "lines", label="gpulse upload", stream=out, tty=False, clock=lambda: now[0])
    for t, done in ((0.5, 100), (1.5, 200), (5.0, 300), (11.0, 600), (12.0, 700), (21.6, 1000)):
        now[0] = t
        p.update(done)
    p.finish()
    assert out.getvalue().splitlines() == [  # from 1 s on, then 10 s apart; the result line follows the work
        "gpulse upload: 200 of 1,000 lines (20%), 133/s, about 6 s left",
        "gpulse upload: 700 of 1,000 lines (70%), 58/s, about 5 s left",
    ]
    quiet = io.StringIO()
    short = Progress(10, "lines", stream=quiet, tty=True, clock=lambda: 0.5)
    short.update(10)
    short.finish()
    assert quiet.getvalue() == ""


def test_on_influxdb_3_a_line_the_server_refuses_is_the_only_one_not_written(tmp_path: Path, clean_env):
    """``--api v3`` writes through ``/api/v3/write_lp`` with partial writes (the 3.x stand-in,
    ``support.fake_influx_v3``): a line whose field type conflicts with the stored column is
    dead-lettered with the server's reason, the rest land in one request."""
    import urllib.request

    from support.fake_influx_v3 import running

    t0 = time.time_ns() - 10**9 * 60
    text = recording(20, t0=t0)
    tokens = tmp_path / "token"
    tokens.write_text("apiv3_t\n")
    tokens.chmod(0o600)
    with running(token="apiv3_t") as fake:
        # the column already holds integers: the file's float util_gpu_pct is refused by the server only
        req = urllib.request.Request(
            f"{fake.url}/api/v3/write_lp?db=gpulse&precision=ns",
            data=f"gpu,host=node0 util_gpu_pct=1i {t0}".encode(),
            headers={"Authorization": "Token apiv3_t"},
        )
        urllib.request.urlopen(req, timeout=10).close()
        f = tmp_path / "rec.lp"
        f.write_text(text)
        res = subprocess.run(
            gpulse_cmd("upload", "--api", "v3", "--url", fake.url, "--token-file", str(tokens), str(f)),
            env=clean_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        steps = fake.engine.rows("gpulse", "train_step")
        writes = [r for r in fake.requests if r == ("POST", "/api/v3/write_lp")]
    assert "to InfluxDB 3 Core 3.10.0-nightly, InfluxDB 3 API at" in res.stderr + res.stdout
    assert len(steps) == 20 and len(writes) == 2  # the direct write above, then one for the whole file
    assert "uploaded 20 lines" in res.stdout and "1 rejected by the server" in res.stdout, res.stdout + res.stderr
    assert "line 21: invalid column type for column 'util_gpu_pct'" in res.stderr


def test_the_rule_is_said_in_the_help() -> None:
    """Before: "retried until" the deadline, while a closed port gave up after 0.24 s and a silent server after 10 s."""
    res = subprocess.run(gpulse_cmd("upload", "--help"), capture_output=True, text=True, timeout=60)
    text = " ".join(res.stdout.split())
    assert f"retry {MAY_HEAL} for at most S seconds in all (default 300); {WILL_NOT_HEAL} fails at once" in text


def test_a_host_name_that_does_not_resolve_fails_at_once(tmp_path: Path, clean_env):
    f = tmp_path / "r.lp"
    f.write_text(recording(2, run="up11"))
    res, _ = run_upload(clean_env, "--url", "http://no-such-host.invalid:8086", "--api", "v1", str(f))
    assert res.returncode == 1 and "cannot resolve 'no-such-host.invalid'" in res.stderr
    assert "asking again" not in res.stderr and "Nothing was sent." in res.stderr


def test_a_silent_server_is_asked_until_the_deadline_not_until_one_request_times_out(tmp_path: Path, clean_env):
    """Before: with --deadline 15 a server that never answers was given up after 10 s (one request's
    timeout); with --deadline 2, after the same 10 s."""
    f = tmp_path / "r.lp"
    f.write_text(recording(2, run="up12"))
    with RawHTTPServer(silent) as server:
        res, _ = run_upload(clean_env, "--url", server.url, "--api", "v1", "--deadline", "2", str(f))
    assert res.returncode == 1, res.stderr
    assert "no complete answer within 2 s" in res.stderr  # the try was cut to the time left
    assert "gave up at the deadline (--deadline 2 s). Nothing was sent." in res.stderr


class RestartingInfluxDB:
    """A reverse proxy in front of a real InfluxDB that is down for its first ``down_s`` seconds.

    Stands in for nginx in front of an InfluxDB that restarts: while its upstream is down nginx answers
    ``502 Bad Gateway`` with its own headers (no ``X-Influxdb-Version``; ``ngx_http_upstream_next`` in
    ``src/http/ngx_http_upstream.c``), then passes each request on. It differs from nginx in
    everything else (one upstream request per request, no keep-alive to the upstream, no buffering)."""

    def __init__(self, upstream: InfluxDB1, down_s: float) -> None:
        self.upstream, self.up_at = upstream, time.monotonic() + down_s
        self.answered_down = 0

    def __call__(self, sock: socket.socket, req: RawRequest, server: RawHTTPServer) -> bool:
        if time.monotonic() < self.up_at:
            self.answered_down += 1
            body = b"<html><body>502 Bad Gateway</body></html>"
            server.send(sock, head("502 Bad Gateway", len(body), "Server: nginx\r\n", influxdb=False) + body)
            return True
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream.port, timeout=30)
        try:
            headers = {k: v for k, v in req.headers.items() if k not in ("host", "connection")}
            conn.request(req.method, req.path, body=req.body or None, headers=headers)
            r = conn.getresponse()
            body = r.read()
            extra = "".join(
                f"{k}: {v}\r\n" for k, v in r.getheaders() if k.lower() not in ("content-length", "connection")
            )
            server.send(sock, head(f"{r.status} {r.reason}", len(body), extra, influxdb=False) + body)
        finally:
            conn.close()
        return True


def test_a_database_that_comes_back_before_the_deadline_gets_everything(tmp_path: Path, influxdb, clean_env):
    f = tmp_path / "r.lp"
    f.write_text(recording(50, run="up13"))
    proxy = RestartingInfluxDB(influxdb, down_s=3.0)
    with RawHTTPServer(proxy) as server:
        res, _ = run_upload(clean_env, "--url", server.url, "--api", "v1", "--deadline", "60", str(f))
    assert res.returncode == 0, res.stderr
    assert proxy.answered_down >= 2  # asked while it was down, and again
    assert f"gpulse upload: {server.url} answered /ping with HTTP 502" in res.stderr and "asking again in" in res.stderr
    assert "uploaded 51 lines" in res.stdout
    assert influxdb.count("train_step", "step", where="run = 'up13'") == 50
