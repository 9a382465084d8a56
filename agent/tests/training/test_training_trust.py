"""Another user's socket: a run never sends to an agent socket someone else controls.

Without ``XDG_RUNTIME_DIR`` a user's default socket is ``/tmp/gpulse-<uid>/agent.sock``, and anyone
can create that directory first. Here a second user does, and listens there with a fake agent
that acknowledges everything and answers ``status`` with a GPU of its own. The user's training
run sends it nothing (not even its name), records every step in its own file (0600), and says why
once, naming the path and its owner; ``gpulse status`` refuses to ask, with the fix. A third test
has an agent of the same user whose acknowledgements are forged by another user: they are ignored.

CI runs as root, so the test creates the two users (and removes them). The interpreter lives under
``/root`` (0700): each child imports what it needs first, then becomes its user.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from training_support import recorded

from gpulse.channel.protocol import RECORD_FILE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates users: needs root")

#: Modules a child imports before it gives up root (it cannot read the interpreter's files after).
PRELOAD = (
    "json, logging, socket, select, struct, errno, sys, argparse, gettext, locale, textwrap, shutil, "
    "gpulse.training, gpulse.training.worker, gpulse.training.identity, gpulse.training.report, "
    "gpulse.channel.recording, gpulse.report.model, gpulse.report.text, shlex, "
    "gpulse.cli.main, gpulse.cli.commands.status, gpulse.agent.status_line, gpulse.influx.connection"
)

FAKE_AGENT = """
import json, os, signal, socket, sys, time
os.setgid(GID); os.setuid(UID)
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
directory = sys.argv[1]
os.makedirs(directory, exist_ok=True)
os.chmod(directory, 0o755)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(os.path.join(directory, "agent.sock"))
os.chmod(os.path.join(directory, "agent.sock"), 0o666)
print("ready", flush=True)
s.settimeout(0.1)
heard = []
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end and not stopped:
    try:
        data, addr = s.recvfrom(70000)
    except TimeoutError:
        continue
    heard.append(data.decode(errors="replace"))
    obj = json.loads(data)
    for m in obj.get("batch", [obj]):
        if m.get("kind") == "status":
            s.sendto(json.dumps({"v": 1, "kind": "status_reply", "status": {"gpus": [{"model": "FAKE"}]}}).encode(), addr)
        elif "seq" in m:
            s.sendto(json.dumps({"v": 1, "kind": "ack", "upto": m["seq"], "host": "evil"}).encode(), addr)
s.setblocking(False)
while True:  # what arrived before SIGTERM and was not read yet
    try:
        heard.append(s.recv(70000).decode(errors="replace"))
    except BlockingIOError:
        break
print(json.dumps(heard), flush=True)
"""


def become(user: pwd.struct_passwd, code: str) -> str:
    """``code`` run as ``user``, after importing :data:`PRELOAD` as root."""
    return f"import os, {PRELOAD}\nos.setgid({user.pw_gid}); os.setuid({user.pw_uid})\n" + textwrap.dedent(code)


@pytest.fixture
def users() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    """A user and a squatter, created for this test and removed after it."""
    names = [f"gp{kind}{uuid.uuid4().hex[:8]}" for kind in ("user", "squat")]
    for name in names:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(names[0]), pwd.getpwnam(names[1])
    finally:
        for name in names:
            subprocess.run(["userdel", name], check=False)


@pytest.fixture
def user_dir(users) -> Iterator[Path]:
    user = users[0]
    d = Path(tempfile.mkdtemp(prefix="gpulse-trust-"))
    os.chmod(d, 0o755)
    os.chown(d, user.pw_uid, user.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def clean_env() -> dict[str, str]:
    """No XDG_RUNTIME_DIR (as under Slurm, cron, su): the default socket is under /tmp."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_") and k != "XDG_RUNTIME_DIR"}


def start_fake_agent(squatter: pwd.struct_passwd, directory: str, seconds: float) -> subprocess.Popen[str]:
    """A squatter's agent on ``directory`` that prints what it heard after ``seconds``, or at once on SIGTERM."""
    code = FAKE_AGENT.replace("GID", str(squatter.pw_gid)).replace("UID", str(squatter.pw_uid))
    proc = subprocess.Popen([sys.executable, "-c", code, directory, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_run_never_sends_to_a_socket_directory_another_user_created(users, user_dir: Path) -> None:
    user, squatter = users
    squatted = f"/tmp/gpulse-{user.pw_uid}"
    fake = start_fake_agent(squatter, squatted, seconds=60)
    try:
        train = become(
            user,
            f"""
            from gpulse.training import Run
            run = Run(name="secret-run", config={{"lr": 0.1}}, output_dir={str(user_dir)!r}, ack_timeout=2)
            for i in range(300):
                with run.step(samples=1):
                    pass
            run.finish()
            print(json.dumps(run.stats()))
        """,
        )
        trained = subprocess.run([sys.executable, "-c", train], env=clean_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
        status = subprocess.run(
            [sys.executable, "-c", become(user, "sys.exit(gpulse.cli.main.main(['status']))")],
            env=clean_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        fake.terminate()  # both are done: whatever they sent has arrived
        heard = json.loads(fake.communicate(timeout=30)[0].splitlines()[-1])
    finally:
        fake.kill()
        shutil.rmtree(squatted, ignore_errors=True)
    assert trained.returncode == 0, trained.stderr
    assert heard == []  # not a step, not the run's name, not a status request
    stats = json.loads(trained.stdout)
    assert stats["sent"] == stats["acked"] == 0 and stats["steps_sent"] == 300
    record = user_dir / RECORD_FILE
    assert len(recorded(record, "train_step")) == 300 and "secret-run" in record.read_text()
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert stat.S_IMODE((user_dir / "metrics_report.json").stat().st_mode) == 0o600
    said = [line for line in trained.stderr.splitlines() if "untrusted_socket" in line]
    owner = f"uid {squatter.pw_uid} ({squatter.pw_name})"
    assert len(said) == 1, trained.stderr
    assert f"{squatted} belongs to {owner}" in said[0] and str(record) in said[0]
    assert status.returncode == 1
    assert (
        status.stderr.splitlines()[0]
        == f"gpulse status: {squatted} belongs to {owner}, not to you, root: not asking it"
    )
    assert status.stderr.splitlines()[1].startswith(f"  fix: remove {squatted}")


def test_acknowledgements_count_only_from_the_agents_own_user(users, user_dir: Path) -> None:
    """The user's own (fake) agent never acks; another user sends acks to the run's address: ignored."""
    user, squatter = users
    sock_dir = user_dir / "run"
    code = become(
        user,
        f"""
        import socket, time
        from gpulse.training import Run
        os.makedirs({str(sock_dir)!r}, mode=0o700)
        mute = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        mute.bind({str(sock_dir / "agent.sock")!r})  # the user's own socket; it never answers
        run = Run(name="acks", output_dir={str(user_dir)!r}, socket_path={str(sock_dir / "agent.sock")!r}, ack_timeout=1)
        with run.step():
            pass
        run.log(loss=1.0)
        data, addr = mute.recvfrom(70000)  # the run's start point: its address is the sender's
        print(addr.hex(), flush=True)
        sys.stdin.readline()  # the forger has sent its acks
        run.finish()
        print(json.dumps(run.stats()))
    """,
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=clean_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    address = bytes.fromhex(proc.stdout.readline().strip())
    forge = become(
        squatter,
        f"""
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for upto in range(1, 20):
            try:
                s.sendto(json.dumps({{"v": 1, "kind": "ack", "upto": upto}}).encode(), {address!r})
            except OSError as e:
                print(e.errno)
                break
        else:
            print("sent")
    """,
    )
    forged = subprocess.run([sys.executable, "-c", forge], capture_output=True, text=True, timeout=30)
    time.sleep(0.2)
    out, err = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0, err
    # connected to its agent's socket, the run's socket takes datagrams from nobody else (EPERM)
    assert forged.stdout.strip() == "1", forged.stdout + forged.stderr
    stats = json.loads(out.splitlines()[-1])
    assert stats["acked"] == 0 and stats["recorded"] == 3  # start, the step, end: all in the file


def test_a_socket_the_user_may_not_reach_is_named_at_once_not_as_a_missing_acknowledgement(
    users, user_dir: Path
) -> None:
    """A system agent's socket in a directory only root may enter (0700, no ``--socket-group``):
    the run used to say, after the acknowledgement timeout, that the agent did not acknowledge."""
    user, _ = users
    system_dir = Path(tempfile.mkdtemp(prefix="gpulse-system-"))  # root's, 0700
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(system_dir / "agent.sock"))
    try:
        train = become(
            user,
            f"""
            import time
            from gpulse.training import Run
            run = Run(name="locked-out", output_dir={str(user_dir)!r}, socket_path={str(system_dir / "agent.sock")!r},
                      ack_timeout=60, write_report=False)
            t0 = time.monotonic()
            for i in range(5):
                with run.step(samples=1):
                    pass
            while not run.stats()["errors"] and time.monotonic() - t0 < 10:
                time.sleep(0.05)
            print(json.dumps({{"seconds": time.monotonic() - t0, "errors": run.stats()["errors"]}}), flush=True)
            run.finish()
        """,
        )
        trained = subprocess.run([sys.executable, "-c", train], env=clean_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        sock.close()
        shutil.rmtree(system_dir, ignore_errors=True)
    assert trained.returncode == 0, trained.stderr
    early = json.loads(trained.stdout)
    assert early["errors"] == {"socket_permission": 1} and early["seconds"] < 5  # at once, not after 60 s
    path = system_dir / "agent.sock"
    said = [line for line in trained.stderr.splitlines() if "socket_permission" in line]
    assert len(said) == 1 and f"cannot reach the agent at {path}: Permission denied" in said[0], trained.stderr
    assert "no acknowledgement" not in trained.stderr
    assert f"(cannot reach the agent at {path}: Permission denied)" in trained.stderr  # the summary at the end
    assert len(recorded(user_dir / RECORD_FILE, "train_step")) == 5
