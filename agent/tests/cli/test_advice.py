"""Every command gpulse prints as advice works where it is printed (issue 14 item 3).

Each test puts gpulse in a situation a new user meets (no GPU, no database, a bare database, a
stale socket, a local demo), takes the commands the output names in backticks (or after "again
any time:"), and runs each one there, as printed. Commands that would run forever (``gpulse
agent``) are stopped with SIGTERM after a few seconds and must have started and stopped cleanly.
Advice that names other programs (``nvidia-smi``, ``docker``, ``nvidia-ctk``, ``influx``,
``timedatectl``) is not run: those programs and their machines are not here.

Before: ``make demo`` said "again any time: gpulse report --run demo-…" (needs a database the
machine lacked), doctor and demo said "start InfluxDB (`make up`)" without Docker, doctor suggested
``--simulate``, which it did not accept.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1, free_port

ADVICE = re.compile(r"`((?:[A-Z_]+=\S* )*gpulse [^`]+)`")


def advised(text: str) -> list[str]:
    """The gpulse commands ``text`` advises, in order, each once."""
    found = ADVICE.findall(text) + re.findall(r"again any time: (gpulse .+)$", text, re.M)
    return list(dict.fromkeys(found))


def follow(command: str, cwd: Path, env: dict[str, str], run_for: float = 4.0) -> subprocess.CompletedProcess[str]:
    """Run an advised command as printed (``gpulse`` is this interpreter's); an agent runs ``run_for`` s."""
    argv = shlex.split(command)
    env = dict(env)
    while "=" in argv[0]:  # VAR=value gpulse ...
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    assert argv[0] == "gpulse"
    proc = subprocess.Popen(
        gpulse_cmd(*argv[1:]), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if argv[1] == "agent":
        try:
            out, err = proc.communicate(timeout=run_for)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
    else:
        out, err = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture
def machine(tmp_path: Path, clean_env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """A directory outside the repository, on this machine: no GPU, no Docker engine, nothing on :8086."""
    work = tmp_path / "work"
    work.mkdir()
    env = dict(clean_env, XDG_STATE_HOME=str(tmp_path / "state"), DOCKER_HOST=f"unix://{tmp_path / 'no-docker.sock'}")
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", 8086)) != 0, "these tests need nothing listening on 127.0.0.1:8086"
    return work, env


def test_the_agent_without_a_gpu_names_the_way_out_and_it_works(machine: tuple[Path, dict[str, str]]) -> None:
    """Before: exit 3 with "(use --simulate N to run without a GPU)", while the README said the agent
    runs simulated GPUs."""
    work, env = machine
    r = follow("gpulse agent --record node.lp", work, env)
    assert r.returncode == 3
    assert advised(r.stderr) == ["gpulse agent --simulate 8"]
    ok = follow("gpulse agent --simulate 8", work, env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ": 8 GPU(s); simulated 8xH100" in ok.stderr


def test_every_command_the_doctor_advises_without_gpu_or_database_works(machine: tuple[Path, dict[str, str]]) -> None:
    work, env = machine
    doctor = follow("gpulse doctor", work, env)
    assert doctor.returncode == 1
    commands = advised(doctor.stdout)
    assert commands == [
        "gpulse agent --simulate 8",
        "gpulse doctor --skip gpus",
        "gpulse agent --simulate 8 --record node.lp",
        "gpulse report --from-file node.lp",
    ], doctor.stdout
    assert "make up" in doctor.stdout and "cannot start one here" in doctor.stdout  # said, not advised
    for command in commands:
        r = follow(command, work, env)
        where = f"{command}\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        if command.startswith("gpulse doctor"):
            assert "– gpus: skipped (--skip)" in r.stdout, where  # it ran; the database is still missing
        else:
            assert r.returncode == 0, where
    assert (work / "node.lp").stat().st_size > 0


def test_with_gpulse_url_exported_the_doctor_s_record_advice_records_only_and_the_doctor_stays_clean(
    machine: tuple[Path, dict[str, str]],
) -> None:
    """Before: `gpulse agent --simulate 8 --record node.lp`, followed with GPULSE_URL exported (as the
    README's database section does), also wrote to that URL and spooled; the doctor then failed on the spool."""
    work, env = machine
    env = dict(env, GPULSE_URL=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    doctor = follow("gpulse doctor", work, env)
    record = next(c for c in advised(doctor.stdout) if "--record" in c)
    assert record == "gpulse agent --simulate 8 --record node.lp"
    r = follow(record, work, env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"(recording only: {env['GPULSE_URL'].join(('GPULSE_URL=', ''))} is not used" in r.stderr
    assert "WARNING" not in r.stderr and "0 spooled" in r.stderr
    assert (work / "node.lp").stat().st_size > 0
    after = follow("gpulse doctor", work, env)
    assert "✔ spool: empty" in after.stdout, after.stdout


def test_the_demo_without_a_database_advises_the_local_demo_and_that_demo_its_report_command(
    machine: tuple[Path, dict[str, str]],
) -> None:
    work, env = machine
    demo = follow("gpulse demo --hours 0.5", work, env)
    assert demo.returncode == 1
    assert advised(demo.stderr) == ["gpulse demo --record demo.lp"]
    local = follow("gpulse demo --record demo.lp", work, env)
    assert local.returncode == 0, local.stderr[-2000:]
    (again,) = advised(local.stdout)
    assert again == "gpulse report --from-file demo.lp --html --out gpulse-demo"
    r = follow(again, work, env)
    assert r.returncode == 0 and "DIAGNOSIS:" in r.stdout, r.stderr[-2000:]


def test_a_demo_into_a_database_advises_the_report_command_with_the_same_connection(
    influxdb: InfluxDB1, machine: tuple[Path, dict[str, str]]
) -> None:
    work, env = machine
    env = dict(env, GPULSE_URL=influxdb.url, GPULSE_API="v1")
    assert follow(f"gpulse setup --url {influxdb.url} --api v1", work, env).returncode == 0
    demo = follow(f"gpulse demo --url {influxdb.url} --api v1 --hours 0.5 --out rep", work, env)
    assert demo.returncode == 0, demo.stderr[-2000:]
    (again,) = advised(demo.stdout)
    assert re.fullmatch(rf"gpulse report --run demo-\S+ --url {influxdb.url} --api v1 --html --out rep", again)
    clean = {k: v for k, v in env.items() if not k.startswith("GPULSE_")}  # the command carries the connection
    r = follow(again, work, clean)
    assert r.returncode == 0 and "DIAGNOSIS:" in r.stdout, r.stderr[-2000:]


def test_the_setup_command_the_doctor_advises_for_a_bare_database_makes_the_doctor_pass(
    influxdb: InfluxDB1, machine: tuple[Path, dict[str, str]]
) -> None:
    work, env = machine
    env = dict(env, GPULSE_SIMULATE="1")
    bare = follow(f"gpulse doctor --url {influxdb.url} --api v1", work, env)
    assert bare.returncode == 1
    (setup,) = advised(bare.stdout)
    assert setup == f"gpulse setup --url {influxdb.url} --api v1"
    assert follow(setup, work, env).returncode == 0
    after = follow(f"gpulse doctor --url {influxdb.url} --api v1", work, env)
    assert after.returncode == 0, after.stdout


def test_the_command_the_doctor_advises_for_a_stale_socket_starts_an_agent_there(
    machine: tuple[Path, dict[str, str]],
) -> None:
    work, env = machine
    sock = work / "run" / "agent.sock"
    sock.parent.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(sock))
    stale.close()  # the file stays, nobody reads it: what a killed agent leaves
    doctor = follow(f"gpulse doctor --socket {sock} --skip database", work, env)
    assert "stale socket" in doctor.stdout
    start = [c for c in advised(doctor.stdout) if c.startswith("gpulse agent") and "--socket" in c]
    assert start == [f"gpulse agent --simulate 8 --url http://127.0.0.1:8086 --socket {sock}"], doctor.stdout
    r = follow(start[0], work, env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"training channel listening on {sock}" in r.stderr
    os.unlink(sock) if sock.exists() else None


def test_the_setup_command_advised_for_a_missing_retention_policy_makes_the_named_default_work(
    influxdb: InfluxDB1, machine: tuple[Path, dict[str, str]]
) -> None:
    """Before: "token: retention policy 'nosuchrp' does not exist", fix: put user:password in the token file."""
    work, env = machine
    env = dict(env, GPULSE_SIMULATE="1")
    doctor = follow(f"gpulse doctor --url {influxdb.url} --api v1 --bucket gpulse/nosuchrp", work, env)
    assert "✘ bucket: retention policy 'nosuchrp' does not exist" in doctor.stdout
    (setup,) = advised(doctor.stdout)
    assert setup == f"gpulse setup --url {influxdb.url} --api v1"
    assert follow(setup, work, env).returncode == 0
    after = follow(f"gpulse doctor --url {influxdb.url} --api v1 --bucket gpulse/raw", work, env)
    assert after.returncode == 0, after.stdout
