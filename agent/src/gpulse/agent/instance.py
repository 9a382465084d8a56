"""One agent per node and destination: lock files held with ``flock`` for the agent's lifetime.

What identifies an agent is what two agents must not share:

* its **socket**: two agents on one socket would steal each other's training datagrams and status
  requests;
* each **destination** it writes to: the database (URL, API, org and bucket/database) with the
  ``host`` tag it writes as, and the ``--record`` file (its absolute path). Two agents writing as one
  host to one database write the same series: the second's ``agent`` health points overwrite the
  first's and its GPU samples duplicate them (agents with their own ``--host`` write apart).

Each lock is ``agent-<sha256 of what it guards>.lock`` in this user's lock directory
(:func:`lock_dir`), whatever ``--socket`` says: one place to look.

``flock`` locks belong to the open file: the kernel drops them when the process ends, however it
ends (``kill -9``, a crash), so a dead agent never leaves a stale lock behind. The file says who
holds it (PID, socket, destinations; JSON), which is what the refusal, ``agent --check`` and
``doctor`` print. Locks are per user: agents of two users writing to one database are not seen.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass

from gpulse.agent.config import AgentConfig


@dataclass(frozen=True)
class Holder:
    """The agent holding a lock, as its lock file says."""

    pid: int | None
    socket: str | None
    destinations: tuple[str, ...]
    lock: str

    def describe(self) -> str:
        pid = f"pid {self.pid}" if self.pid else "pid unknown"
        sock = f"socket {self.socket}" if self.socket else "no socket"
        dest = ", ".join(self.destinations) or "nowhere"
        return f"{pid}, {sock}, writing to {dest}"


class AnotherAgent(Exception):
    """A lock this agent needs is held by a running agent."""

    def __init__(self, what: str, holder: Holder) -> None:
        self.what, self.holder = what, holder
        super().__init__(f"another gpulse agent already runs for {what} ({holder.describe()}; lock {holder.lock})")

    @property
    def fix(self) -> str:
        stop = f"`kill {self.holder.pid}`" if self.holder.pid else f"the process holding {self.holder.lock}"
        other = "another --socket" if self.what.startswith("socket ") else "another destination"
        return f"one agent per node and destination: stop that one first ({stop}), or give this one {other}"


def database_destination(cfg: AgentConfig) -> str | None:
    return cfg.connection.describe() if cfg.connection.url else None


def lock_dir() -> str:
    """This user's directory of agent locks: ``$XDG_RUNTIME_DIR/gpulse-locks``, else ``/tmp/gpulse-<uid>-locks``.

    Not the socket's directory: the channel creates that one with its own modes (0750 with
    ``--socket-group``), which a lock created first would pre-empt."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(runtime, "gpulse-locks") if runtime else f"/tmp/gpulse-{os.getuid()}-locks"


def locks(cfg: AgentConfig) -> list[tuple[str, str]]:
    """(what it guards, lock file path) for each thing this configuration must hold alone."""
    guarded = ([f"socket {os.path.abspath(cfg.socket_path)}"] if not cfg.no_socket else []) + destinations(cfg)
    return [
        (what, os.path.join(lock_dir(), f"agent-{hashlib.sha256(what.encode()).hexdigest()[:20]}.lock"))
        for what in guarded
    ]


def destinations(cfg: AgentConfig) -> list[str]:
    """The database (as described, no secret) with the ``host`` tag the agent writes as, and the record
    file (absolute path): what two agents must not share."""
    out = []
    if db := database_destination(cfg):
        out.append(f"{db} as host {cfg.host}")
    if cfg.record:
        out.append(f"record file {os.path.abspath(cfg.record)}")
    return out


def _private_dir(path: str) -> None:
    """Create ``path`` 0700 if needed; refuse one of another user (someone could hold our locks)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise PermissionError(f"lock directory {path} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o022:
        raise PermissionError(f"lock directory {path} is writable by others: chmod 700 it")


def _read_holder(fd: int, path: str) -> Holder:
    try:
        data = json.loads(os.pread(fd, 65536, 0) or b"{}")
    except ValueError:  # written this instant, or not ours
        data = {}
    return Holder(data.get("pid"), data.get("socket"), tuple(data.get("destinations") or ()), path)


class InstanceLock:
    """Every lock of one agent, held until :meth:`release` (or the process ends)."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self._fds: list[int] = []

    def acquire(self) -> InstanceLock:
        """Take every lock, or raise :class:`AnotherAgent` (holding none) naming the agent that has it."""
        me = json.dumps(
            {
                "pid": os.getpid(),
                "socket": None if self.cfg.no_socket else self.cfg.socket_path,
                "destinations": destinations(self.cfg),
            }
        ).encode()
        try:
            for what, path in locks(self.cfg):
                _private_dir(os.path.dirname(path))
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read_holder(fd, path)
                    os.close(fd)
                    raise AnotherAgent(what, holder) from None
                self._fds.append(fd)
                os.ftruncate(fd, 0)
                os.pwrite(fd, me, 0)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing drops the flock; the file stays (removing it would race a new agent)
        self._fds = []


def running_holder(cfg: AgentConfig) -> tuple[str, Holder] | None:
    """(what, who) for the first lock of this configuration a running agent holds; ``None`` if free.

    Read without taking anything from the agent: a free lock is taken for an instant and let go."""
    for what, path in locks(cfg):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # no lock file: nobody ever held it
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return what, _read_holder(fd, path)
        finally:
            os.close(fd)
    return None
