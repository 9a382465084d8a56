"""The environment a process started with (``/proc/PID/environ``), where the kernel lets us read it.

The file holds the environment at ``execve`` (later ``putenv`` calls are invisible), and reading it
passes a ptrace access check: same uid, or ``CAP_SYS_PTRACE`` / root (proc_pid_environ(5)). A refusal
is an answer (:attr:`Environ.denied`), not an error: the agent then attributes from the cgroup alone.
Only the variables named in ``keep`` are kept, so no secret of a job's environment stays in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: What Slurm sets in a task's environment that attribution uses (``src/common/env.c`` setup_env).
SLURM_KEYS = ("SLURM_JOB_ID", "SLURM_JOB_SLUID", "SLURM_JOB_USER", "SLURM_JOB_ACCOUNT", "SLURM_JOB_PARTITION")


@dataclass(frozen=True)
class Environ:
    values: Mapping[str, str] = field(default_factory=dict)
    #: the kernel refused (another user's process and no CAP_SYS_PTRACE)
    denied: bool = False


GONE = Environ()


def parse_environ(raw: bytes, keep: Iterable[str] = SLURM_KEYS) -> dict[str, str]:
    """``NAME=value`` entries separated by NUL bytes; only the names in ``keep``."""
    wanted = set(keep)
    out: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        key = name.decode("utf-8", "replace")
        if sep and key in wanted:
            out[key] = value.decode("utf-8", "replace")
    return out


def read_environ(proc_root: str, pid: int, keep: Iterable[str] = SLURM_KEYS) -> Environ:
    """The kept variables of ``pid``'s initial environment; denied or empty, never an exception."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)
    except PermissionError:
        return Environ(denied=True)
    except OSError:  # the process is gone
        return GONE
    return Environ(parse_environ(raw, keep))
