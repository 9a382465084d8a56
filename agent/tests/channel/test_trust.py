"""Which agent sockets a client trusts: the user's, root's or the named group's, changeable by nobody else.

The tests run as root (CI does), so they can hand a directory to another uid with ``chown``; the
last one runs the check as an unprivileged user, for whom root's socket is trusted.
"""

from __future__ import annotations

import grp
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpulse.channel.trust import UntrustedSocket, verify_socket

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to other users")


def agent_socket(directory: Path, dir_mode: int = 0o700) -> Path:
    """A bound socket in ``directory`` (created with ``dir_mode``), as the agent leaves it."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, dir_mode)
    path = directory / "agent.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.close()  # the file stays: trust is about who made it, not whether it answers
    os.chmod(path, 0o600)
    return path


def test_the_users_own_socket_is_trusted_and_its_owner_returned(tmp_path: Path) -> None:
    assert verify_socket(str(agent_socket(tmp_path / "run"))) == os.geteuid()


def test_no_socket_yet_in_a_trusted_directory_is_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    assert verify_socket(str(tmp_path / "run" / "agent.sock")) is None
    assert verify_socket(str(tmp_path / "missing" / "agent.sock")) is None


def test_a_directory_another_user_created_first_is_refused_naming_it_and_its_owner(tmp_path: Path) -> None:
    squat = tmp_path / "gpulse-1000"
    path = agent_socket(squat)
    os.chown(squat, NOBODY, NOBODY)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(UntrustedSocket) as e:
        verify_socket(str(path))
    assert str(e.value) == f"{squat} belongs to uid {NOBODY} (nobody), not to you, root"
    assert e.value.owner == f"uid {NOBODY} (nobody)"
    assert f"remove {squat}" in e.value.fix and "XDG_RUNTIME_DIR" in e.value.fix
    # before the squatter's socket exists, the directory alone is reason enough
    os.unlink(path)
    with pytest.raises(UntrustedSocket, match="belongs to uid 65534"):
        verify_socket(str(path))


def test_a_socket_another_user_put_in_the_users_directory_is_refused(tmp_path: Path) -> None:
    path = agent_socket(tmp_path / "run")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(UntrustedSocket, match=f"^{path} belongs to uid {NOBODY}"):
        verify_socket(str(path))


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o720])
def test_a_socket_directory_others_may_write_is_refused_even_with_the_sticky_bit(tmp_path: Path, mode: int) -> None:
    path = agent_socket(tmp_path / "run", mode)
    with pytest.raises(UntrustedSocket, match=f"is writable by .* \\(mode {mode:04o}\\)") as e:
        verify_socket(str(path))
    assert e.value.fix == f"chmod go-w {tmp_path / 'run'}"


def test_a_directory_above_may_be_shared_only_with_the_sticky_bit(tmp_path: Path) -> None:
    path = agent_socket(tmp_path / "shared" / "run")
    os.chmod(tmp_path / "shared", 0o1777)  # like /tmp
    assert verify_socket(str(path)) == 0
    os.chmod(tmp_path / "shared", 0o777)  # anyone may rename run/ and put their own in its place
    with pytest.raises(UntrustedSocket, match=f"^{tmp_path / 'shared'} is writable by everyone"):
        verify_socket(str(path))


def test_a_world_writable_socket_is_refused(tmp_path: Path) -> None:
    path = agent_socket(tmp_path / "run")
    os.chmod(path, 0o666)
    with pytest.raises(UntrustedSocket, match="is writable by everyone"):
        verify_socket(str(path))


def test_a_group_agent_is_trusted_only_when_the_user_names_its_group(tmp_path: Path) -> None:
    group = grp.getgrgid(os.getegid()).gr_name
    path = agent_socket(tmp_path / "run", 0o750)
    os.chmod(path, 0o660)
    for p in (tmp_path / "run", path):
        os.chown(p, NOBODY, os.getegid())  # the agent runs as another user, in the group
    with pytest.raises(UntrustedSocket, match=f"belongs to uid {NOBODY} \\(nobody\\), not to you, root$"):
        verify_socket(str(path))
    assert verify_socket(str(path), group=group) == NOBODY
    assert verify_socket(str(path), group=os.getegid()) == NOBODY
    os.chmod(tmp_path / "run", 0o770)  # writable by the trusted group: still the group's
    assert verify_socket(str(path), group=group) == NOBODY
    with pytest.raises(KeyError):
        verify_socket(str(path), group="no-such-group-gpulse")


def test_a_symlink_is_followed_and_both_paths_are_checked(tmp_path: Path) -> None:
    real = agent_socket(tmp_path / "real")
    link = tmp_path / "link.sock"
    link.symlink_to(real)
    assert verify_socket(str(link)) == 0
    os.chown(real, NOBODY, NOBODY)
    with pytest.raises(UntrustedSocket, match=f"^{real} belongs to uid {NOBODY}"):
        verify_socket(str(link))
    os.chown(real, 0, 0)
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir()
    os.chown(elsewhere, NOBODY, NOBODY)
    (elsewhere / "agent.sock").symlink_to(real)
    os.lchown(elsewhere / "agent.sock", NOBODY, NOBODY)
    with pytest.raises(UntrustedSocket, match="belongs to uid 65534"):
        verify_socket(str(elsewhere / "agent.sock"))  # its owner could point the link anywhere


def test_for_an_ordinary_user_roots_socket_is_trusted(tmp_path: Path) -> None:
    """A system agent runs as root: every user's training may send to it."""
    base = Path("/tmp") / f"gpulse-trust-test-{os.getpid()}"
    try:
        path = agent_socket(base / "run", 0o755)
        os.chmod(base, 0o755)
        # the interpreter lives under /root (0700): import first, then become nobody
        code = (
            "import os, sys; from gpulse.channel.trust import verify_socket\n"
            f"os.setgid({NOBODY}); os.setuid({NOBODY}); print(verify_socket(sys.argv[1]))"
        )
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "0"
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=True)
