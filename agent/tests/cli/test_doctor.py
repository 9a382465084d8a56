"""``gpulse doctor``: each check finds its problem, says how to fix it, and the exit code is 0 only
when nothing failed.

The database is a real InfluxDB 1.x (Debian's ``influxd``) prepared by the real ``gpulse setup
--api v1``. What cannot run here is replaced at its boundary, and each test says so: the Docker
Engine API by a small HTTP server on a Unix socket answering ``/version`` and ``/info`` as the
engine documents them; the machine's clock by shifting the doctor's own clock reading.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import ThreadingMixIn, UnixStreamServer

import pytest
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1

from gpulse.agent.config import load_config
from gpulse.cli import doctor


def cfg_for(url: str | None, tmp_path: Path, **extra: object):
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


@pytest.fixture(scope="module")
def prepared(influxdb_module: InfluxDB1, tmp_path_factory: pytest.TempPathFactory) -> InfluxDB1:
    """The module's InfluxDB 1.x after `gpulse setup --api v1` (database, retention policies, CQs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    out = gpulse(env, "setup", "--api", "v1", "--url", influxdb_module.url)
    assert out.returncode == 0, out.stdout + out.stderr
    return influxdb_module


def gpulse(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gpulse_cmd(*args), env=env, capture_output=True, text=True, timeout=120, check=False)


def by_name(results: list[doctor.Result]) -> dict[str, doctor.Result]:
    return {r.name: r for r in results}


def test_a_prepared_database_with_simulated_gpus_passes_every_check_and_exits_0(
    prepared: InfluxDB1, clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = dict(clean_env, GPULSE_SIMULATE="2", XDG_STATE_HOME=str(tmp_path / "state"))
    out = gpulse(env, "doctor", "--api", "v1", "--url", prepared.url)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in ("gpus", "database", "token", "layout", "downsampling", "clock", "socket", "spool"):
        assert any(line.startswith(f"✔ {name}:") for line in lines), (name, out.stdout)
    assert "✘" not in out.stdout
    assert "2 GPU(s) via simulated" in out.stdout
    assert "retention policies raw (30d), 1m (400d), 1h (INF)" in out.stdout
    assert out.stdout.rstrip().splitlines()[-1].startswith("all ")


def test_a_bare_database_fails_layout_and_downsampling_with_gpulse_setup_as_the_fix(
    influxdb: InfluxDB1, tmp_path: Path
) -> None:
    results = by_name(doctor.run_checks(cfg_for(influxdb.url, tmp_path, simulate=1)))
    assert results["database"].status == "ok"
    assert results["token"].status == "ok"
    for name in ("layout", "downsampling"):
        assert results[name].status == "fail", results[name]
        assert "gpulse setup" in results[name].fix
    assert "lacks retention policies raw, 1m, 1h" in results["layout"].detail


def test_an_unreachable_database_fails_once_and_the_checks_that_need_it_are_not_applicable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    results = doctor.run_checks(cfg_for(f"http://127.0.0.1:{port}", tmp_path, simulate=1))
    r = by_name(results)
    assert r["database"].status == "fail"
    assert "--url" in r["database"].fix
    assert [r[n].status for n in ("token", "layout", "downsampling", "clock")] == ["skip"] * 4
    text = doctor.render(results)
    assert "✘ database:" in text and "    fix: " in text
    assert "1 check(s) failed" in text


def test_no_nvidia_driver_fails_the_gpu_check_with_the_driver_and_the_demo_as_fixes(tmp_path: Path) -> None:
    """The real pynvml on this machine, which has no NVIDIA driver: nvmlInit fails."""
    gpus = doctor.check_gpus(cfg_for(None, tmp_path))
    assert gpus.status == "fail"
    assert "NVML" in gpus.detail
    assert "nvidia-smi" in gpus.fix and "make demo" in gpus.fix
    assert doctor.check_containers(gpus, in_container=False).status == "skip"
    inside = doctor.check_containers(gpus, in_container=True)
    assert inside.status == "skip" and "gpus check" in inside.detail  # one failure, one fix: in the gpus check
    assert "--gpus all" in gpus.fix


def test_wrong_credentials_fail_the_token_check(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    server = InfluxDB1(tmp_path_factory.mktemp("influxd-auth"), auth=True).start()
    try:
        server.query("CREATE USER admin WITH PASSWORD 'right' WITH ALL PRIVILEGES")
        token = tmp_path / "token"
        token.write_text("admin:wrong\n")
        token.chmod(0o600)
        cfg = cfg_for(server.url, tmp_path, simulate=1, token_file=str(token))
        r = by_name(doctor.run_checks(cfg))
    finally:
        server.stop()
    assert r["token"].status == "fail"
    assert "authentication failed" in r["token"].detail
    assert "user:password" in r["token"].fix
    assert r["layout"].status == "skip" and r["downsampling"].status == "skip"


def test_a_clock_off_by_half_a_minute_fails_and_one_in_step_passes(prepared: InfluxDB1, tmp_path: Path) -> None:
    """The real server's Date header against this host's clock, read shifted by 30 s for the failing case."""
    conn = cfg_for(prepared.url, tmp_path, simulate=1).connection
    assert doctor.check_clock(conn).status == "ok"
    off = doctor.check_clock(conn, now=lambda: time.time() + 30)
    assert off.status == "fail"
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
    r = doctor.check_containers(doctor.ok("gpus", "1 GPU"), in_container=False)
    assert r.status == "fail", r
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
    r = doctor.check_containers(doctor.ok("gpus", "1 GPU"), in_container=False)
    assert r.status == "ok", r
    assert "nvidia runtime" in r.detail and "28.2.2" in r.detail
    assert doctor.check_containers(doctor.ok("gpus", "1 GPU"), simulated=True).status == "skip"


def test_no_docker_engine_makes_the_container_check_not_applicable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'absent.sock'}")
    r = doctor.check_containers(doctor.ok("gpus", "1 GPU"), in_container=False)
    assert r.status == "skip"
    assert "no Docker engine" in r.detail
    # the agent's own container: it sees the GPUs, and without pid: host its process table is useless
    own_pids = doctor.check_containers(doctor.ok("gpus", "1 GPU"), in_container=True, host_pid=False)
    assert own_pids.status == "fail" and "pid: host" in own_pids.fix
    host_pids = doctor.check_containers(doctor.ok("gpus", "1 GPU"), in_container=True, host_pid=True)
    assert host_pids.status == "ok"


# -- local state: socket and spool -------------------------------------------------------------------
def test_a_running_agent_answers_on_the_socket_and_a_stale_socket_fails(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    sock = tmp_path / "run" / "agent.sock"
    cfg = cfg_for(None, tmp_path, simulate=1)
    assert doctor.check_socket(cfg).status == "ok"  # nothing there yet, and the directory can be made
    agent = subprocess.Popen(
        gpulse_cmd(
            "agent", "--simulate", "2", "--record", str(tmp_path / "rec.lp"), "--socket", str(sock), "--duration", "30"
        ),
        env=clean_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        r = doctor.check_socket(cfg)
        assert r.status == "ok", r
        assert "answers" in r.detail and "2 GPU(s)" in r.detail
    finally:
        agent.kill()
        agent.wait()
    # SIGKILL left the socket file behind with nobody reading it
    assert sock.exists()
    stale = doctor.check_socket(cfg)
    assert stale.status == "fail"
    assert "stale" in stale.detail and "gpulse agent" in stale.fix


def test_the_spool_check_counts_waiting_lines_and_finds_a_damaged_segment_without_touching_it(tmp_path: Path) -> None:
    """The agent's real spool writes the segments; one byte of a record is then flipped, as a bad disk would."""
    from gpulse.delivery.spool import Spool

    cfg = cfg_for(None, tmp_path, simulate=1)
    spool = Spool(cfg.spool_dir, max_bytes=1 << 20, segment_bytes=4096)
    for i in range(6):
        assert spool.append([f"gpu,host=a util_gpu_pct={i}.0 {i}\n"] * 40) is not None
    spool.close()
    healthy = doctor.check_spool(cfg)
    assert healthy.status == "ok", healthy
    assert "240 line(s) waiting" in healthy.detail

    segs = sorted(Path(cfg.spool_dir).glob("*.seg"))
    assert len(segs) >= 2
    before = {p.name: p.read_bytes() for p in segs}
    data = bytearray(segs[-1].read_bytes())
    data[40] ^= 0xFF  # inside the first record's payload
    segs[-1].write_bytes(bytes(data))
    damaged = doctor.check_spool(cfg)
    assert damaged.status == "fail", damaged
    assert "1 segment(s) damaged" in damaged.detail
    assert "skips the damaged part" in damaged.fix
    after = sorted(Path(cfg.spool_dir).glob("*.seg"))
    assert [p.name for p in after] == list(before), "the doctor must not delete or rewrite segments"


def test_a_spool_near_its_cap_fails_with_the_database_connection_as_the_fix(tmp_path: Path) -> None:
    from gpulse.delivery.spool import Spool

    cfg = cfg_for(None, tmp_path, simulate=1, spool_max_bytes="64KiB")
    spool = Spool(cfg.spool_dir, max_bytes=cfg.spool_max_bytes)
    while spool.bytes < 0.9 * cfg.spool_max_bytes:
        spool.append(["gpu,host=a util_gpu_pct=1.0 1\n"] * 50)
    spool.close()
    r = doctor.check_spool(cfg)
    assert r.status == "fail", r
    assert "oldest data is dropped" in r.detail
    assert "database connection" in r.fix


# -- InfluxDB 2.x: a stand-in for its management API -------------------------------------------------
def test_on_influxdb_2_the_doctor_checks_buckets_dbrps_and_the_last_task_runs(tmp_path: Path) -> None:
    """:class:`FakeInfluxV2Admin` stands in for InfluxDB 2.x's documented management API (no 2.x server
    runs here); the real ``gpulse setup`` prepares it, then a task's last run is marked failed as the
    server does when a run fails (``lastRunStatus``/``lastRunError`` on the task)."""
    from support.fake_influx_v2_admin import FakeInfluxV2Admin

    from gpulse.influx.connection import Connection
    from gpulse.influx.downsample import TIERS, task_name
    from gpulse.influx.setup.v2 import setup_v2

    with FakeInfluxV2Admin() as fake:
        conn = Connection(url=fake.url, api="v2", token=fake.state.operator_token, token_source="test")
        assert doctor.check_layout(conn).status == "fail"  # only the initial bucket so far
        setup_v2(conn)
        layout = doctor.check_layout(conn)
        assert layout.status == "ok", layout
        assert "gpulse_1m" in layout.detail and "gpulse_1h (forever)" in layout.detail
        ds = doctor.check_downsampling(conn)
        assert ds.status == "ok", ds
        assert "not run yet" in ds.detail
        task = fake.task(task_name(TIERS[0]))
        task.update(lastRunStatus="failed", lastRunError="runtime error: type conflict in column _value")
        failed = doctor.check_downsampling(conn)
        assert failed.status == "fail"
        assert "type conflict" in failed.detail
        assert f"influx task log list --task-id {task['id']}" in failed.fix
        bad = Connection(url=fake.url, api="v2", token="not-a-token", token_source="test")
        rejected = doctor.check_credentials(bad)
        assert rejected.status == "fail" and "token" in rejected.fix


# -- GPUs through NVML: the fake NVML boundary ---------------------------------------------------------
def test_the_gpu_check_lists_what_each_gpu_supports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """:class:`FakeNvml` stands in for the NVIDIA driver behind the real ``pynvml`` module: an H100 with
    GPM and a consumer RTX 4090 without it."""
    from support.fake_pynvml import FakeNvml, h100, rtx4090

    FakeNvml.install(monkeypatch, gpus=[h100(0), h100(1), rtx4090(2)])
    r = doctor.check_gpus(cfg_for(None, tmp_path))
    assert r.status == "ok", r
    lines = r.detail.splitlines()
    assert lines[0].startswith("3 GPU(s) via NVML (driver ")
    h100_line = next(line for line in lines if "GPU 0-1" in line)
    rtx_line = next(line for line in lines if "GPU 2 " in line)
    assert "sm_active_pct" not in h100_line
    assert "not supported:" in rtx_line and "sm_active_pct" in rtx_line and "tensor_active_pct" in rtx_line
