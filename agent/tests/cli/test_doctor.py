"""``gpulse doctor``: each check finds its problem, says how to fix it, and the exit code is 0 only
when nothing failed.

The database is a real InfluxDB 1.x (Debian's ``influxd``) prepared by the real ``gpulse setup
--api v1``; the agent, its spool and its socket are real. What cannot run here is replaced at its
boundary, and each test says so: the Docker Engine API by a small HTTP server on a Unix socket
answering ``/version`` and ``/info`` as the engine documents them; the NVIDIA driver by
:class:`FakeNvml` under the real ``pynvml``; InfluxDB 2.x by :class:`FakeInfluxV2Admin`; the
machine's clock by shifting the doctor's own clock reading. What a new user saw before is in the
docstring of the test that reproduces it (issue 14).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import ThreadingMixIn, UnixStreamServer

import pytest
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1, free_port
from support.waiting import wait_until

from gpulse.agent.config import AgentConfig, load_config
from gpulse.cli import doctor
from gpulse.cli.checks import database, gpus, local
from gpulse.cli.checks.base import Context, Result, Status
from gpulse.influx.connection import Connection


def cfg_for(url: str | None, tmp_path: Path, **extra: object) -> AgentConfig:
    """The agent's configuration as `gpulse doctor --api v1 --url URL` would resolve it."""
    values: dict[str, object] = {
        "url": url,
        "api": "v1",
        "org": None,
        "bucket": None,
        "token_file": None,
        "spool_dir": str(tmp_path / "spool"),
        "socket": str(tmp_path / "run" / "agent.sock"),
    }
    values.update(extra)
    args = argparse.Namespace(**values)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    return load_config(args, env)


def ctx_for(cfg: AgentConfig) -> Context:
    return Context(cfg, live=True)


@pytest.fixture(scope="module")
def prepared(influxdb_module: InfluxDB1, tmp_path_factory: pytest.TempPathFactory) -> InfluxDB1:
    """The module's InfluxDB 1.x after `gpulse setup --api v1` (database, retention policies, CQs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    out = gpulse(env, "setup", "--api", "v1", "--url", influxdb_module.url)
    assert out.returncode == 0, out.stdout + out.stderr
    return influxdb_module


def gpulse(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gpulse_cmd(*args), env=env, capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


def by_name(results: list[Result]) -> dict[str, Result]:
    return {r.name: r for r in results}


def statuses(results: list[Result]) -> dict[str, str]:
    return {r.name: r.status.value for r in results}


# -- the whole doctor -----------------------------------------------------------------------------------
def test_a_prepared_database_with_simulated_gpus_passes_every_check_and_exits_0(
    prepared: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = dict(clean_env, GPULSE_SIMULATE="2", XDG_STATE_HOME=str(tmp_path / "state"))
    out = gpulse(env, "doctor", "--api", "v1", "--url", prepared.url)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in ("gpus", "database", "token", "bucket", "layout", "downsampling", "clock", "socket", "spool"):
        assert any(line.startswith(f"✔ {name}:") for line in lines), (name, out.stdout)
    assert "✘" not in out.stdout
    assert "2 GPU(s) via simulated (--simulate 2)" in out.stdout
    assert "retention policies raw (30d), 1m (400d), 1h (INF)" in out.stdout
    assert out.stdout.rstrip().splitlines()[-1].startswith("all ")


def test_a_bare_database_fails_layout_and_downsampling_with_the_setup_command_for_this_connection(
    influxdb: InfluxDB1, tmp_path: Path
) -> None:
    results = by_name(doctor.run(cfg_for(influxdb.url, tmp_path, simulate=1)))
    assert [results[n].status for n in ("database", "token", "bucket")] == [Status.OK] * 3
    for name in ("layout", "downsampling"):
        assert results[name].status is Status.FAIL, results[name]
        assert f"`gpulse setup --url {influxdb.url} --api v1`" in results[name].fix
    assert "lacks retention policies raw, 1m, 1h" in results["layout"].detail


def test_an_unreachable_database_fails_once_and_the_checks_that_need_it_say_which_one(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    results = doctor.run(cfg_for(url, tmp_path, simulate=1))
    r = by_name(results)
    assert r["database"].status is Status.FAIL
    assert f"start the InfluxDB at {url} or correct --url" in r["database"].fix
    assert "`gpulse agent --simulate 1 --record node.lp`" in r["database"].fix  # what works without one
    for name in ("token", "bucket", "layout", "downsampling", "clock"):
        assert r[name].status is Status.SKIP and r[name].detail == "not checked: the database check did not pass"
    text = doctor.render_doctor(results)
    assert "✘ database:" in text and "    fix: " in text
    assert "1 check(s) failed" in text


def test_no_nvidia_driver_fails_the_gpu_check_with_the_one_no_gpu_story_as_the_fix(tmp_path: Path) -> None:
    """The real pynvml on this machine, which has no NVIDIA driver: nvmlInit fails.

    Before: the fix suggested ``--simulate``, which doctor did not accept, and never ``--skip gpus``."""
    g = gpus.check_gpus(ctx_for(cfg_for(None, tmp_path)))
    assert g.status is Status.FAIL
    assert "NVML" in g.detail and "(use --simulate" not in g.detail
    assert "nvidia-smi" in g.fix and "--gpus all" in g.fix
    assert "`gpulse agent --simulate 8`" in g.fix and "GPULSE_SIMULATE=8" in g.fix
    assert "`gpulse doctor --skip gpus`" in g.fix
    assert gpus.containers(False, in_container=False).status is Status.SKIP
    inside = gpus.containers(False, in_container=True)
    assert inside.status is Status.SKIP and "gpus check" in inside.detail  # one failure, one fix: in the gpus check


def test_without_a_gpu_the_doctor_accepts_simulate_and_recognises_a_simulated_agent_on_the_socket(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """Before: `gpulse doctor --simulate 2` was "unrecognized arguments", and with a simulated agent
    running the gpus check still failed."""
    env = dict(clean_env, XDG_STATE_HOME=str(tmp_path / "state"))
    flag = gpulse(env, "doctor", "--simulate", "2", "--skip", "database")
    assert re.search(r"^✔ gpus: 2 GPU\(s\) via simulated \(--simulate 2\)", flag.stdout, re.M), (
        flag.stdout + flag.stderr
    )
    agent = subprocess.Popen(
        gpulse_cmd("agent", "--simulate", "3", "--record", str(tmp_path / "r.lp")),
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        sock = Path(env["XDG_RUNTIME_DIR"]) / "gpulse" / "agent.sock"
        wait_until(sock.exists, what="the agent's socket")
        out = gpulse(env, "doctor", "--skip", "database")
    finally:
        agent.terminate()
        agent.wait(30)
    assert re.search(
        rf"^✔ gpus: no NVIDIA driver here \(.*\); the agent on {re.escape(str(sock))} runs 3 simulated H100 GPU\(s\)",
        out.stdout,
        re.M,
    ), out.stdout
    assert re.search(r"^✔ socket: agent .* answers on .*, 3 GPU\(s\) \(simulated H100\)", out.stdout, re.M)


def test_wrong_credentials_fail_the_token_check_and_say_where_they_came_from(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    server = InfluxDB1(tmp_path_factory.mktemp("influxd-auth"), auth=True).start()
    try:
        server.query("CREATE USER admin WITH PASSWORD 'right' WITH ALL PRIVILEGES")
        token = tmp_path / "token"
        token.write_text("admin:n0t-the-pa55word\n")
        token.chmod(0o600)
        r = by_name(doctor.run(cfg_for(server.url, tmp_path, simulate=1, token_file=str(token))))
    finally:
        server.stop()
    assert r["token"].status is Status.FAIL
    assert f"refused the credentials (user:password) from file {token}" in r["token"].detail
    assert "user:password" in r["token"].fix and "n0t-the-pa55word" not in r["token"].detail + r["token"].fix
    assert [r[n].status for n in ("bucket", "layout", "downsampling")] == [Status.SKIP] * 3


def test_a_v1_server_with_the_default_api_v2_gets_setup_s_message_from_the_database_check(
    prepared: InfluxDB1, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """Before: "✘ token: buckets API answered HTTP 404: 404 page not found", with a fix about the token."""
    token = tmp_path / "token"
    token.write_text("some-token\n")
    token.chmod(0o600)
    env = dict(clean_env, GPULSE_SIMULATE="1", XDG_STATE_HOME=str(tmp_path / "state"))
    out = gpulse(env, "doctor", "--url", prepared.url, "--token-file", str(token))
    assert out.returncode == 1
    assert f"✘ database: {prepared.url} is InfluxDB 1.6" in out.stdout
    assert "    fix: use --api v1 (with --token-file holding user:password)" in out.stdout
    assert "– token: not checked: the database check did not pass" in out.stdout
    assert "buckets API" not in out.stdout


def test_a_missing_retention_policy_is_a_layout_problem_not_a_credentials_one(
    prepared: InfluxDB1, tmp_path: Path
) -> None:
    """Before: "✘ token: retention policy 'nosuchrp' does not exist", fix: put user:password in the token file."""
    r = by_name(doctor.run(cfg_for(prepared.url, tmp_path, simulate=1, bucket="gpulse/nosuchrp")))
    assert r["token"].status is Status.OK
    assert r["bucket"].status is Status.FAIL
    assert (
        r["bucket"].detail
        == "retention policy 'nosuchrp' does not exist on database 'gpulse' (it has 1h, 1m, autogen, raw)"
    )
    assert (
        "--bucket gpulse/POLICY" in r["bucket"].fix
        and f"`gpulse setup --url {prepared.url} --api v1`" in r["bucket"].fix
    )
    assert "password" not in r["bucket"].fix


def test_a_clock_off_by_half_a_minute_fails_and_one_in_step_passes(prepared: InfluxDB1, tmp_path: Path) -> None:
    """The real server's Date header against this host's clock, read shifted by 30 s for the failing case."""
    ctx = ctx_for(cfg_for(prepared.url, tmp_path, simulate=1))
    assert database.check_clock(ctx).status is Status.OK
    off = database.check_clock(ctx, now=lambda: time.time() + 30)
    assert off.status is Status.FAIL
    assert "+30" in off.detail or "+29" in off.detail or "+31" in off.detail
    assert "ntp" in off.fix.lower()


# -- containers: a stand-in for the Docker Engine API on a Unix socket ----------------------------------
class _UnixHTTPServer(ThreadingMixIn, UnixStreamServer):
    daemon_threads = True


def _docker_engine(path: Path, info: dict) -> _UnixHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith("/version"):
                body = {"ApiVersion": "1.45", "Version": info.get("ServerVersion", "")}
            elif self.path.endswith("/info"):
                body = info
            else:
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def address_string(self) -> str:  # a Unix socket has no client address
            return "unix"

        def log_message(self, *args: object) -> None:
            pass

    server = _UnixHTTPServer(str(path), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def docker_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict], None]]:
    servers: list[_UnixHTTPServer] = []

    def start(info: dict) -> None:
        path = tmp_path / f"docker{len(servers)}.sock"
        servers.append(_docker_engine(path, info))
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_docker_without_the_nvidia_runtime_fails_with_the_container_toolkit_as_the_fix(docker_engine) -> None:
    docker_engine(
        {"ServerVersion": "28.2.2", "Runtimes": {"runc": {}, "io.containerd.runc.v2": {}}, "DefaultRuntime": "runc"}
    )
    r = gpus.containers(True, in_container=False)
    assert r.status is Status.FAIL, r
    assert "no NVIDIA runtime" in r.detail and "runc" in r.detail
    assert "nvidia-ctk runtime configure" in r.fix


def test_docker_with_the_nvidia_runtime_passes(docker_engine) -> None:
    docker_engine(
        {
            "ServerVersion": "28.2.2",
            "Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}},
            "DefaultRuntime": "runc",
        }
    )
    r = gpus.containers(True, in_container=False)
    assert r.status is Status.OK, r
    assert "nvidia runtime" in r.detail and "28.2.2" in r.detail
    assert gpus.containers(True, simulated=True).status is Status.SKIP


def test_no_docker_engine_makes_the_container_check_not_applicable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'absent.sock'}")
    r = gpus.containers(True, in_container=False)
    assert r.status is Status.SKIP
    assert "no Docker engine" in r.detail
    # the agent's own container: it sees the GPUs, and without pid: host its process table is useless
    own_pids = gpus.containers(True, in_container=True, host_pid=False)
    assert own_pids.status is Status.FAIL and "pid: host" in own_pids.fix
    assert gpus.containers(True, in_container=True, host_pid=True).status is Status.OK


# -- local state: socket and spool -------------------------------------------------------------------
def test_a_running_agent_answers_on_the_socket_and_a_stale_socket_fails_with_the_command_that_starts_one(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    sock = tmp_path / "run" / "agent.sock"
    cfg = cfg_for(None, tmp_path, simulate=1)
    assert local.check_socket(ctx_for(cfg)).status is Status.OK  # nothing there yet, and the directory can be made
    agent = subprocess.Popen(
        gpulse_cmd(
            "agent", "--simulate", "2", "--record", str(tmp_path / "rec.lp"), "--socket", str(sock), "--duration", "30"
        ),
        env=clean_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(sock.exists, what="the agent's socket")
        r = local.check_socket(ctx_for(cfg))
        assert r.status is Status.OK, r
        assert "answers" in r.detail and "2 GPU(s)" in r.detail
    finally:
        agent.kill()
        agent.wait()
    # SIGKILL left the socket file behind with nobody reading it
    assert sock.exists()
    stale = local.check_socket(ctx_for(cfg))
    assert stale.status is Status.FAIL
    assert "stale" in stale.detail
    assert stale.fix == (
        f"start the agent: `gpulse agent --simulate 1 --url {cfg.connection.url} --api v1 --spool-dir {cfg.spool_dir} "
        f"--socket {sock}` (it replaces a stale socket)"
    )


def test_a_socket_directory_of_another_user_or_writable_by_others_fails_with_the_fix(tmp_path: Path) -> None:
    """Issue 15 item 2: doctor said "✔ socket: agent 0.1.0 answers" for another user's fake agent. (CI runs
    as root, so a directory can be given to another user.)"""
    squatted = tmp_path / "squat"
    squatted.mkdir(mode=0o755)
    os.chown(squatted, 65534, 65534)  # nobody
    r = local.check_socket(ctx_for(cfg_for(None, tmp_path, simulate=1, socket=str(squatted / "agent.sock"))))
    assert r.status is Status.FAIL
    assert f"{squatted} belongs to uid 65534" in r.detail
    assert f"remove {squatted}" in r.fix
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    r = local.check_socket(ctx_for(cfg_for(None, tmp_path, simulate=1, socket=str(open_dir / "agent.sock"))))
    assert r.status is Status.FAIL and "writable by everyone" in r.detail and f"chmod go-w {open_dir}" in r.fix


def test_data_waiting_in_a_sink_s_spool_is_reported_per_sink_and_fails_once_it_waited_too_long(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """Before: `✔ spool: 0 segment(s), 0 B` while spool/influx/...001.seg held 31 KB (91 lines): the agent
    spools into one folder per sink and the doctor read only the top folder."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: everything is spooled
    token = tmp_path / "token"
    token.write_text("t\n")
    token.chmod(0o600)
    spool = tmp_path / "spool"
    run = gpulse(
        clean_env, "agent", "--simulate", "2", "--url", url, "--token-file", str(token), "--duration", "3",
        "--flush-interval", "0.5", "--spool-dir", str(spool), "--no-socket",
        "--summary-file", str(tmp_path / "summary.json"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    final = json.loads((tmp_path / "summary.json").read_text())
    assert final["lines_spooled"] > 0 and final["lines_written"] == 0
    cfg = cfg_for(url, tmp_path, api="v2", simulate=2, token_file=str(token), flush_interval=0.5)
    time.sleep(2.6)  # the oldest point is now older than 5 flush intervals of 0.5 s
    r = local.check_spool(ctx_for(cfg))
    assert r.status is Status.FAIL, r
    sink = next(line for line in r.detail.splitlines() if line.strip().startswith("influx"))
    assert f"{final['lines_spooled']} line(s)" in sink and "oldest point" in sink and url in sink
    assert "it is not being delivered" in r.detail
    agent = f"gpulse agent --simulate 2 --url {url} --token-file {token} --spool-dir {spool} --socket {cfg.socket}"
    assert r.fix == f"start the agent, which replays the spool in order: `{agent}`"
    # `agent --check` asks whether the agent would start: the waiting data is news, not a failure
    quiet = local.check_spool(Context(cfg, live=False))
    # a configuration that writes elsewhere: the agent will keep this data aside, and says how to replay it
    other = cfg_for(f"http://127.0.0.1:{free_port()}", tmp_path, api="v2", simulate=2, token_file=str(token))
    aside = local.check_spool(Context(other, live=False))
    assert f"not meant for InfluxDB v2 API at {other.connection.url}" in aside.detail
    assert "--replay-spool-to-new-destination" in aside.detail
    assert quiet.status is Status.OK and "not being delivered" not in quiet.detail
    assert quiet.detail.splitlines()[:1] == r.detail.splitlines()[:1] and sink.split(", oldest")[0] in quiet.detail


def test_the_spool_check_finds_a_damaged_record_without_touching_the_files(tmp_path: Path) -> None:
    """The agent's real spool writes the segments; one byte of a record is then flipped, as a bad disk would."""
    from gpulse.delivery.spool import Spool

    cfg = cfg_for(None, tmp_path, simulate=1)
    spool = Spool(Path(cfg.spool_dir) / "record", max_bytes=1 << 20, segment_bytes=4096)
    now = time.time_ns()
    for i in range(6):
        assert spool.append([f"gpu,host=a util_gpu_pct={i}.0 {now}\n"] * 40) is not None
    spool.close()
    healthy = local.check_spool(Context(cfg, live=False))
    assert healthy.status is Status.OK, healthy
    assert "record: 240 line(s)" in healthy.detail
    segs = sorted((Path(cfg.spool_dir) / "record").glob("*.seg"))
    assert len(segs) >= 2
    before = {p.name: p.read_bytes() for p in segs}
    data = bytearray(segs[-1].read_bytes())
    data[60] ^= 0xFF  # inside the first record's payload
    segs[-1].write_bytes(bytes(data))
    damaged = local.check_spool(Context(cfg, live=False))
    assert damaged.status is Status.FAIL, damaged
    assert "1 damaged record(s)" in damaged.detail
    assert "skips the damaged part" in damaged.fix
    after = sorted((Path(cfg.spool_dir) / "record").glob("*.seg"))
    assert {p.name: p.read_bytes() for p in after} != before and [p.name for p in after] == list(before)


def test_a_spool_near_its_cap_fails_with_the_database_connection_as_the_fix(tmp_path: Path) -> None:
    from gpulse.delivery.spool import Spool

    cfg = cfg_for(None, tmp_path, simulate=1, spool_max_bytes="64KiB")
    spool = Spool(Path(cfg.spool_dir) / "influx", max_bytes=cfg.spool_max_bytes)
    while spool.bytes < 0.9 * cfg.spool_max_bytes:
        spool.append([f"gpu,host=a util_gpu_pct=1.0 {time.time_ns()}\n"] * 50)
    spool.close()
    r = local.check_spool(Context(cfg, live=False))
    assert r.status is Status.FAIL, r
    assert "oldest data is dropped" in r.detail
    assert "database connection" in r.fix


# -- InfluxDB 2.x: a stand-in for its management API -------------------------------------------------
def test_on_influxdb_2_the_doctor_checks_the_token_buckets_dbrps_and_the_last_task_runs(tmp_path: Path) -> None:
    """:class:`FakeInfluxV2Admin` stands in for InfluxDB 2.x's documented management API (no 2.x server
    runs here); the real ``gpulse setup`` prepares it, then a task's last run is marked failed as the
    server does when a run fails (``lastRunStatus``/``lastRunError`` on the task)."""
    from support.fake_influx_v2_admin import FakeInfluxV2Admin

    from gpulse.influx.downsample import TIERS, task_name
    from gpulse.influx.setup.v2 import setup_v2

    with FakeInfluxV2Admin() as fake:
        conn = Connection(url=fake.url, api="v2", token=fake.state.operator_token, token_source="file t")
        ctx = Context(AgentConfig(connection=conn, simulate=1), live=True)
        assert database.check_database(ctx).status is Status.OK
        assert database.check_token(ctx).status is Status.OK
        assert database.check_bucket(ctx).status is Status.OK  # the initial bucket is the agent's
        layout = database.check_layout(ctx)
        assert layout.status is Status.FAIL and "gpulse_1m" in layout.detail  # only the initial bucket so far
        setup_v2(conn)
        layout = database.check_layout(ctx)
        assert layout.status is Status.OK, layout
        assert "gpulse_1m" in layout.detail and "gpulse_1h (forever)" in layout.detail
        ds = database.check_downsampling(ctx)
        assert ds.status is Status.OK, ds
        assert "not run yet" in ds.detail
        task = fake.task(task_name(TIERS[0]))
        task.update(lastRunStatus="failed", lastRunError="runtime error: type conflict in column _value")
        failed = database.check_downsampling(ctx)
        assert failed.status is Status.FAIL
        assert "type conflict" in failed.detail
        assert f"influx task log list --task-id {task['id']}" in failed.fix
        bad = Connection(url=fake.url, api="v2", token="not-a-token", token_source="file t")
        rejected = database.check_token(Context(AgentConfig(connection=bad), live=True))
        assert rejected.status is Status.FAIL and "refused the credentials (token) from file t" in rejected.detail
        assert "not-a-token" not in rejected.detail + rejected.fix
        nobucket = Connection(
            url=fake.url, api="v2", bucket="nope", token=fake.state.operator_token, token_source="file t"
        )
        missing = database.check_bucket(Context(AgentConfig(connection=nobucket), live=True))
        assert missing.status is Status.FAIL and "bucket 'nope' does not exist in org 'gpulse'" in missing.detail


def test_on_influxdb_3_the_doctor_checks_the_token_databases_triggers_and_plugin(tmp_path: Path) -> None:
    """:mod:`support.fake_influx_v3` stands in for InfluxDB 3 Core (no 3.x server runs here); the real
    ``gpulse setup`` code prepares it. No DBRP, bucket or task is looked for: 3.x has none."""
    from support.fake_influx_v3 import running

    from gpulse.influx.setup.v3 import PLUGIN_FILE, setup_v3

    with running(token="apiv3_t") as fake:
        conn = Connection(url=fake.url, api="v3", token="apiv3_t", token_source="file t")
        ctx = Context(AgentConfig(connection=conn, simulate=1), live=True)
        database_ok = database.check_database(ctx)
        assert database_ok.status is Status.OK and "InfluxDB 3 Core 3." in database_ok.detail
        assert database.check_token(ctx).status is Status.OK
        bare = [database.check_bucket(ctx), database.check_layout(ctx), database.check_downsampling(ctx)]
        assert [r.status for r in bare] == [Status.FAIL] * 3
        assert "database 'gpulse' does not exist" in bare[0].detail
        assert all(f"gpulse setup --url {fake.url} --api v3" in r.fix for r in bare)
        setup_v3(conn)
        layout, ds = database.check_layout(ctx), database.check_downsampling(ctx)
        assert database.check_bucket(ctx).status is Status.OK
        assert (
            layout.status is Status.OK
            and layout.detail == "databases gpulse (30d), gpulse/1m (400d), gpulse/1h (forever)"
        )
        assert (
            ds.status is Status.OK and "gpulse_1m (cron:0 1/10 * * * *)" in ds.detail and "core look-back" in ds.detail
        )
        fake.triggers["gpulse_1h"].disabled = True
        assert "differ from this gpulse's (core) or are disabled" in database.check_downsampling(ctx).detail
        fake.triggers["gpulse_1h"].disabled = False
        (fake.plugin_dir / PLUGIN_FILE).write_text("# old\n")
        assert database.check_downsampling(ctx).detail == f"the plugin file {PLUGIN_FILE} differs from this gpulse's"
        bad = Connection(url=fake.url, api="v3", token="apiv3_not-it", token_source="file t")
        refused = database.check_database(Context(AgentConfig(connection=bad), live=True))
        assert refused.status is Status.FAIL and "refused the ones given" in refused.detail
        assert "apiv3_not-it" not in refused.detail + refused.fix
        assert database.check_clock(ctx).status is Status.OK  # the Date header of a /ping with the token


# -- GPUs through NVML: the stand-in under the real bindings ---------------------------------------------
def test_the_gpu_check_lists_what_each_gpu_supports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """:class:`FakeNvml` stands in for the NVIDIA driver under the real ``pynvml`` module: two H100s
    with GPM and a consumer RTX 4090 without it."""
    from support.fake_pynvml import FakeNvml, h100, rtx4090

    FakeNvml.install(monkeypatch, gpus=[h100(0), h100(1), rtx4090(2)])
    r = gpus.check_gpus(ctx_for(cfg_for(None, tmp_path)))
    assert r.status is Status.OK, r
    lines = r.detail.splitlines()
    assert lines[0].startswith("3 GPU(s) via NVML (driver ")
    h100_line = next(line for line in lines if "GPU 0-1" in line)
    rtx_line = next(line for line in lines if "GPU 2 " in line)
    assert "sm_active_pct" not in h100_line
    assert "not supported:" in rtx_line and "sm_active_pct" in rtx_line and "tensor_active_pct" in rtx_line


def test_the_gpu_check_says_when_process_data_needs_privileges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12: on a MIG-enabled H200 the GPU-wide process list is for privileged callers only (NVML's
    NO_PERMISSION, as the stand-in answers a non-root caller); the doctor names the GPU and what to do."""
    from support.fake_pynvml import FakeNvml, h100, mig_h200

    FakeNvml.install(monkeypatch, gpus=[mig_h200(0), h100(1)], root=False)
    r = gpus.check_gpus(ctx_for(cfg_for(None, tmp_path)))
    assert r.status is Status.OK, r
    line = next(line for line in r.detail.splitlines() if "privileges" in line)
    assert line.strip().startswith("GPU 0: process list needs privileges") and "run the agent as root" in line
    assert "GPU 1:" not in r.detail  # the H100 without MIG reads its list
