"""``make up`` (scripts/up.sh) on the machines it meets: with a Docker engine, and without one.

No Docker engine runs here, and no NVIDIA driver. The script runs from a copy of the files it uses
(so the repository's own ``.env`` and ``secrets/`` are never touched), with the project's
virtualenv, and the ``docker`` command replaced by a stand-in on ``PATH`` that answers as the
real CLI does: ``docker info`` failing with the daemon's "Cannot connect" message (no engine), or
succeeding and logging ``docker compose up -d --wait`` (an engine). With an engine, the InfluxDB it
would start is :class:`FakeInfluxV2` (the documented ``/api/v2/write`` contract). The agent itself is
real and stops after ``GPULSE_UP_DURATION`` seconds; without a driver it runs simulated GPUs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.fake_influx_v2 import FakeInfluxV2
from support.fake_influx_v3 import running
from support.influxd import InfluxDB1

from gpulse.lineprotocol.parse import read_lines

pytestmark = pytest.mark.slow  # make up and make demo, end to end: not for the fast lane

SECRETS = ("influxdb-admin-password", "influxdb-admin-token", "grafana-admin-password", "grafana-influx-token")
NO_ENGINE = """#!/usr/bin/env bash
echo "docker $*" >> "$DOCKER_LOG"
if [ "$1" = info ]; then
  echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
  exit 1
fi
exit 0
"""
ENGINE = """#!/usr/bin/env bash
echo "docker $*" >> "$DOCKER_LOG"
exit 0
"""


@pytest.fixture
def checkout(repo_root: Path, tmp_path: Path) -> Path:
    """The files `make up` reads, copied into a fresh directory."""
    root = tmp_path / "gpulse"
    (root / "scripts").mkdir(parents=True)
    for rel in ("scripts/up.sh", "scripts/gen-secrets.sh", ".env.example", "docker-compose.yml"):
        shutil.copy(repo_root / rel, root / rel)
    return root


def _env(tmp_path: Path, docker_script: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(docker_script)
    (bin_dir / "docker").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    env.update(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        DOCKER_LOG=str(tmp_path / "docker.log"),
        VENV=str(Path(sys.executable).parent.parent),
        GPULSE_UP_DURATION="3",
        XDG_RUNTIME_DIR=str(tmp_path / "run"),
        XDG_STATE_HOME=str(tmp_path / "state"),
    )
    (tmp_path / "run").mkdir(mode=0o700, exist_ok=True)
    return env


def _up(checkout: Path, env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(checkout / "scripts/up.sh"), *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _secret_values(checkout: Path) -> list[str]:
    return [v for name in SECRETS if (v := (checkout / "secrets" / name).read_text().strip())]


def test_without_docker_make_up_creates_env_and_secrets_and_the_agent_records_locally(
    checkout: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path, NO_ENGINE)
    out = _up(checkout, env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text

    # one sentence each for the missing driver and the missing engine, with what to do instead
    assert text.count("No NVIDIA driver") == 1 and "make demo" in text
    assert "runs 8 simulated GPUs (--simulate 8; GPULSE_SIMULATE=8 does the same for any gpulse command" in text
    assert "No Docker engine reachable" in text
    assert "--url" in text and "--token-file" in text and "gpulse upload" in text and "gpulse report" in text

    dotenv = (checkout / ".env").read_text()
    assert f"GPULSE_UID={os.getuid()}\n" in dotenv and f"GPULSE_GID={os.getgid()}\n" in dotenv
    assert f"GPULSE_HOSTNAME={socket.gethostname()}\n" in dotenv
    assert f"GPULSE_SOCKET_DIR={tmp_path / 'run' / 'gpulse'}\n" in dotenv
    assert stat.S_IMODE((checkout / ".env").stat().st_mode) == 0o600

    assert stat.S_IMODE((checkout / "secrets").stat().st_mode) == 0o700
    for name in SECRETS:
        assert stat.S_IMODE((checkout / "secrets" / name).stat().st_mode) == 0o600, name
    values = _secret_values(checkout)
    assert len(values) == 3 and len(set(values)) == 3 and all(len(v) >= 32 for v in values)
    assert (checkout / "secrets/grafana-influx-token").read_text() == ""  # gpulse setup fills it
    assert not any(v in text for v in values), "a secret was printed"

    record = checkout / ".gpulse/agent.lp"
    gpus = {p.tags["gpu"] for _, _, p in read_lines(record) if not isinstance(p, Exception) and p.measurement == "gpu"}
    assert gpus == {str(i) for i in range(8)}

    # a second `make up` keeps the secrets and the .env it made
    again = _up(checkout, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _secret_values(checkout) == values
    assert (checkout / ".env").read_text() == dotenv
    assert "generated secrets" not in again.stdout


def _advice(text: str, label: str) -> list[str]:
    """The command printed after ``label:`` (``$VENV/bin/python -m gpulse ...``), split for subprocess."""
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"{label}:"))
    return shlex.split(line.split(":", 1)[1])


def test_every_command_make_up_prints_without_docker_works_where_it_is_printed(
    checkout: Path, tmp_path: Path, influxdb: InfluxDB1
) -> None:
    """Before: "look at it: gpulse report --from-file .gpulse/agent.lp" answered "no training run found"
    (exit 2). The upload and agent commands name a server: here a real InfluxDB 1.x, so they are
    followed with the line's own "InfluxDB 1.x: add --api v1 and put user:password in the token file"."""
    env = _env(tmp_path, NO_ENGINE)
    out = _up(checkout, env)
    assert out.returncode == 0, out.stdout + out.stderr
    look = _advice(out.stdout, "look at it")
    r = subprocess.run(look, cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "a node report" in r.stdout and "GPU 7 (GPU-" in r.stdout
    assert (checkout / ".gpulse/node-report/node_report.html").exists()

    token = tmp_path / "token"
    token.write_text("admin:pw\n")
    token.chmod(0o600)

    def placed(argv: list[str]) -> list[str]:
        subs = {"https://influxdb.example:8086": influxdb.url, "ORG": "gpulse", "PATH": str(token)}
        return [subs.get(a, a) for a in argv] + ["--api", "v1"]

    def gpu_points() -> int:
        series = influxdb.query('SELECT count("util_gpu_pct") FROM "gpu"', db="gpulse")["results"][0].get("series")
        return series[0]["values"][0][1] if series else 0

    upload = subprocess.run(
        placed(_advice(out.stdout, "upload it later")), cwd=checkout, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert upload.returncode == 0, upload.stdout + upload.stderr
    uploaded = gpu_points()
    assert uploaded >= 8
    send = out.stdout.split("or send to an existing InfluxDB instead of recording:")[1].splitlines()[1]
    agent = subprocess.run(
        placed(shlex.split(send)), cwd=checkout, env=dict(env, GPULSE_DURATION="3", GPULSE_FLUSH_INTERVAL="0.2"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert agent.returncode == 0, agent.stderr[-2000:]
    assert gpu_points() > uploaded  # the agent wrote there directly


def test_with_docker_make_up_starts_the_stack_and_the_agent_writes_to_it_with_the_generated_token(
    checkout: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path, ENGINE)
    subprocess.run(["bash", str(checkout / "scripts/gen-secrets.sh")], check=True, capture_output=True, env=env)
    token = (checkout / "secrets/influxdb-admin-token").read_text().strip()
    influx = FakeInfluxV2(token=token).start()
    try:
        port = influx.url.rsplit(":", 1)[1]
        example = (checkout / ".env.example").read_text()
        (checkout / ".env").write_text(example.replace("GPULSE_INFLUX_PORT=8086", f"GPULSE_INFLUX_PORT={port}"))
        out = _up(checkout, env)
    finally:
        influx.stop()
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    calls = (tmp_path / "docker.log").read_text().splitlines()
    assert "docker compose up -d --wait" in calls
    assert "No Docker engine" not in text
    assert token not in text
    written = {line.split(",", 1)[0] for line in influx.lines}
    assert {"gpu", "gpu_info"} <= written, written
    assert all(r.headers.get("Authorization") == f"Token {token}" for r in influx.requests)


def test_make_demo_without_docker_runs_the_whole_demo_locally_and_its_advice_works(
    checkout: Path, tmp_path: Path, influxdb: InfluxDB1
) -> None:
    env = _env(tmp_path, NO_ENGINE)
    (checkout / ".env.example").write_text(
        (checkout / ".env.example").read_text().replace("GPULSE_INFLUX_PORT=8086", "GPULSE_INFLUX_PORT=1")
    )
    previous = checkout / ".gpulse/demo.lp"
    previous.parent.mkdir()
    previous.write_text("previous,host=a value=1i 1\n")  # an earlier demo's recording
    out = _up(checkout, env, "demo")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the demo runs locally" in out.stdout
    assert "DIAGNOSIS:" in out.stdout
    assert (checkout / ".gpulse/demo/metrics_report.html").exists()
    assert previous.stat().st_size > 1_000_000
    assert not previous.read_text().startswith("previous,")  # replaced, not appended to
    assert not list(previous.parent.glob("demo.lp.partial*"))
    # Before: "again any time: gpulse report --run demo-...", which needs a database this machine lacks
    again = out.stdout.split("again any time: ", 1)[1].splitlines()[0]
    assert again == "gpulse report --from-file .gpulse/demo.lp --html --out .gpulse/demo"
    r = subprocess.run(
        [sys.executable, "-m", *shlex.split(again)], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "DIAGNOSIS:" in r.stdout, r.stderr
    # "into an InfluxDB": here a real InfluxDB 1.x, so with --api v1 added to both, as the line says
    line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("into an InfluxDB:"))
    assert "(InfluxDB 1.x: add --api v1 to both" in out.stdout
    token = tmp_path / "token"
    token.write_text("admin:pw\n")
    token.chmod(0o600)
    command = line.split(":", 1)[1].replace("URL", influxdb.url).replace("PATH", str(token))
    command = command.replace(" --url ", " --api v1 --url ")
    r = subprocess.run(["bash", "-c", command], cwd=checkout, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    counted = influxdb.query('SELECT count("util_gpu_pct") FROM "gpu"', db="gpulse")["results"][0]["series"]
    assert counted[0]["values"][0][1] > 1000


def test_make_demo_with_gpulse_url_set_says_it_goes_there_does_so_and_keeps_the_local_recording(
    checkout: Path, tmp_path: Path, influxdb: InfluxDB1
) -> None:
    """Before: "the demo runs locally", then exit 2, with the previous 26 MB .gpulse/demo.lp already
    deleted; with a token it wrote to that database while saying "locally"."""
    env = _env(tmp_path, NO_ENGINE)
    env.update(GPULSE_URL=influxdb.url, GPULSE_API="v1")  # a database without `gpulse setup`
    previous = checkout / ".gpulse/demo.lp"
    previous.parent.mkdir()
    previous.write_text("previous,host=a value=1i 1\n")
    out = _up(checkout, env, "demo")
    assert f"GPULSE_URL is set, so the demo goes to the InfluxDB at {influxdb.url}" in out.stdout
    assert "locally" not in out.stdout
    assert out.returncode == 1, out.stdout + out.stderr  # that database is not set up: said, with the fix
    assert f"gpulse setup --url {influxdb.url} --api v1" in out.stderr
    assert previous.read_text() == "previous,host=a value=1i 1\n"


# -- InfluxDB 3: GPULSE_INFLUX=v3 (environment or .env) ---------------------------------------------


def _dotenv(checkout: Path, **settings: str) -> None:
    """.env as `make up` would copy it from .env.example, with ``settings`` changed."""
    text = (checkout / ".env.example").read_text()
    for key, value in settings.items():
        assert f"\n{key}=" in text, key
        text = "\n".join(f"{key}={value}" if ln.startswith(f"{key}=") else ln for ln in text.splitlines()) + "\n"
    (checkout / ".env").write_text(text)


def test_gpulse_influx_v3_in_the_environment_starts_profile_v3_and_the_agent_writes_to_influxdb_3(
    checkout: Path, tmp_path: Path
) -> None:
    """.env says v2 (as .env.example does); the environment's v3 wins, as it does for docker compose."""
    env = _env(tmp_path, ENGINE) | {"GPULSE_INFLUX": "v3"}
    subprocess.run(["bash", str(checkout / "scripts/gen-secrets.sh")], check=True, capture_output=True, env=env)
    token = (checkout / "secrets/influxdb3-admin-token").read_text().strip()
    with running(token=token) as influx3:
        _dotenv(checkout, GPULSE_INFLUX="v2", GPULSE_INFLUX3_PORT=influx3.url.rsplit(":", 1)[1])
        out = _up(checkout, env)
        gpus = {r["gpu"] for r in influx3.engine.rows("gpulse", "gpu")}
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    calls = (tmp_path / "docker.log").read_text().splitlines()
    assert "docker compose --profile v3 up -d --wait grafana-v3 alert-log" in calls
    assert "docker compose up -d --wait" not in calls  # none of the 2.9 stack
    assert "starting InfluxDB 3 Core and Grafana" in text and "Grafana http://127.0.0.1:3001" in text
    assert gpus == {str(i) for i in range(8)}  # the stand-in refuses a write without its admin token
    assert token not in text


@pytest.mark.parametrize(("where", "said"), [("environment", "from the environment"), (".env", "from .env")])
def test_an_unknown_gpulse_influx_stops_make_up_at_once_saying_what_it_may_be(
    checkout: Path, tmp_path: Path, where: str, said: str
) -> None:
    env = _env(tmp_path, ENGINE)
    if where == "environment":
        env["GPULSE_INFLUX"] = "3"
    else:
        _dotenv(checkout, GPULSE_INFLUX="influxdb3")
    out = _up(checkout, env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"({said}): it must be v2 (InfluxDB 2.9, the default) or v3 (InfluxDB 3 Core)" in out.stderr
    assert "GPULSE_INFLUX=v3 make up" in out.stderr
    assert not (tmp_path / "docker.log").exists()  # nothing was started


def test_without_docker_and_v3_in_env_every_command_make_up_prints_works_against_influxdb_3(
    checkout: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path, NO_ENGINE)
    _dotenv(checkout, GPULSE_INFLUX="v3")
    out = _up(checkout, env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "No Docker engine reachable" in out.stdout and "or send to an existing InfluxDB 3 instead" in out.stdout
    assert "--api v1" not in out.stdout  # the 1.x hint belongs to the v2 choice

    look = subprocess.run(_advice(out.stdout, "look at it"), cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert look.returncode == 0 and "a node report" in look.stdout, look.stderr

    token = "apiv3_an-admin-token"
    token_file = tmp_path / "influxdb3-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    with running(token=token) as influx3:
        subs = {"https://influxdb.example:8181": influx3.url, "PATH": str(token_file)}

        def run(argv: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
            argv = [subs.get(a, a) for a in argv]
            return subprocess.run(argv, cwd=checkout, env=env | extra, capture_output=True, text=True, timeout=180)

        setup = run(_advice(out.stdout, "set it up once"))
        assert setup.returncode == 0, setup.stdout + setup.stderr
        assert {"gpulse", "gpulse/1m", "gpulse/1h"} <= set(influx3.databases)
        assert influx3.triggers  # the downsampling plugin's triggers
        upload = run(_advice(out.stdout, "upload it later"))
        assert upload.returncode == 0, upload.stdout + upload.stderr
        uploaded = len(influx3.engine.rows("gpulse", "gpu"))
        assert uploaded >= 8
        send = out.stdout.split("or send to an existing InfluxDB 3 instead of recording:")[1].splitlines()[1]
        assert "--simulate 8 --api v3" in send
        agent = run(shlex.split(send), GPULSE_DURATION="3", GPULSE_FLUSH_INTERVAL="0.2")
        assert agent.returncode == 0, agent.stderr[-2000:]
        assert len(influx3.engine.rows("gpulse", "gpu")) > uploaded  # the agent wrote there directly


def test_make_demo_with_v3_and_no_docker_says_so_and_its_influxdb_3_advice_works(
    checkout: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path, NO_ENGINE) | {"GPULSE_INFLUX": "v3", "GPULSE_UP_DEMO_HOURS": "0.2"}
    _dotenv(checkout, GPULSE_INFLUX3_PORT="1")  # nothing answers there
    out = _up(checkout, env, "demo")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "No Docker engine and no InfluxDB 3 Core at http://127.0.0.1:1, so the demo runs locally" in out.stdout
    line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("into an InfluxDB 3:"))
    token = "apiv3_an-admin-token"
    token_file = tmp_path / "influxdb3-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    with running(token=token) as influx3:
        command = line.split(":", 1)[1].replace("URL", influx3.url).replace("PATH", str(token_file))
        r = subprocess.run(["bash", "-c", command], cwd=checkout, env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr
        recorded = {
            (p.tags["gpu"], p.ts)
            for _, _, p in read_lines(checkout / ".gpulse/demo.lp")
            if not isinstance(p, Exception) and p.measurement == "gpu"
        }
        assert len(recorded) > 500  # 8 GPUs, 0.2 h of samples
        assert len(influx3.engine.rows("gpulse", "gpu")) == len(recorded)  # every point uploaded
        assert influx3.engine.rows("gpulse", "train_step")


def test_make_down_stops_the_v3_stack_and_the_agent_container_too(repo_root: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, ENGINE)
    r = subprocess.run(["make", "-s", "down"], cwd=repo_root, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "docker.log").read_text().splitlines() == ["docker compose --profile v3 --profile agent down"]


def test_make_demo_with_v3_goes_to_the_running_influxdb_3_with_its_admin_token(checkout: Path, tmp_path: Path) -> None:
    """An InfluxDB 3 answers on the v3 port (as the compose server does: /health open), already set up
    (the setup-v3 service's work): `make demo` fills it, through --api v3 and the v3 admin token."""
    env = _env(tmp_path, ENGINE) | {"GPULSE_INFLUX": "v3", "GPULSE_UP_DEMO_HOURS": "0.2"}
    subprocess.run(["bash", str(checkout / "scripts/gen-secrets.sh")], check=True, capture_output=True, env=env)
    token_file = checkout / "secrets/influxdb3-admin-token"
    with running(token=token_file.read_text().strip(), disable_authz=("health", "ping")) as influx3:
        _dotenv(checkout, GPULSE_INFLUX3_PORT=influx3.url.rsplit(":", 1)[1])
        setup = subprocess.run(
            [sys.executable, "-m", "gpulse", "setup", "--api", "v3", "--url", influx3.url, "--token-file", str(token_file)],
            cwd=checkout, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert setup.returncode == 0, setup.stderr
        out = _up(checkout, env, "demo", timeout=400)  # the stand-in downsamples on DataFusion, in this process
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert influx3.engine.rows("gpulse", "train_step") and influx3.engine.rows("gpulse/1m", "gpu")
    assert not (tmp_path / "docker.log").exists() or "compose" not in (tmp_path / "docker.log").read_text()
    assert "locally" not in out.stdout and token_file.read_text().strip() not in out.stdout + out.stderr
    assert "http://127.0.0.1:3001" in out.stdout  # the links go to the v3 stack's Grafana
