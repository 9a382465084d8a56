"""The GPU-to-job mapping a Slurm prolog writes, for an agent that cannot see the jobs' processes.

Where the agent runs without the host's PID namespace, ``/proc/PID/cgroup`` of a GPU process is out
of its reach and the kernel names no job. ``deploy/slurm/prolog.sh`` then records, as root, which
job holds which GPU, in one directory:

* ``<gpu index>`` or ``<gpu index>.<GPU instance id>`` (MIG): one job id per line. This is
  dcgm-exporter's HPC job mapping (``internal/pkg/transformation/hpc.go``), so a prolog written for
  it serves gpulse too. Several lines mean several jobs share the GPU (sharding, MPS).
* ``job_<id>``: ``SLURM_JOB_USER=``, ``SLURM_JOB_UID=``, ``SLURM_JOB_ACCOUNT=``,
  ``SLURM_JOB_PARTITION=`` lines, gpulse's own (dcgm-exporter reads only the numeric names).

A GPU is held by a job here only when its file names exactly one job; a shared GPU has no one
holder, as a time-sliced GPU of the kubelet has none. The mapping never overrides the kernel: it
names the job of a process whose cgroup names none, and completes the user, account and partition
of a Slurm job the cgroup named (:meth:`SlurmMapping.complete`).

Trust: the files label GPU time for accounting, so only root (or the agent's own user) may have
written them: a directory or file owned by another user, or writable by group or others, is
ignored and said once in the log, with the fix.

Cost: :meth:`SlurmJobFiles.mapping` lists the directory (one ``scandir``, an ``lstat`` per entry)
at most every ``min_interval_s`` and reads only the files whose size, mtime or inode changed (the
few lines of each are parsed again); a
missing directory is no mapping (the prolog makes it with the first job), and a bad line or file
name is counted and said once an hour per kind of fault, the rest of the mapping kept.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gpulse.sources.attribution.cgroup import Attribution, Scheduler
from gpulse.util.countlog import CountedLog

log = logging.getLogger(__name__)

DEFAULT_DIR = "/run/gpulse/slurm-jobs"
_GPU_FILE = re.compile(r"^\d+(\.\d+)?$")
_JOB_FILE = re.compile(r"^job_(\d+)$")
_JOB_ID = re.compile(r"^\d+$")
#: the job file's keys, as the prolog's environment names them, and the Attribution field each fills
JOB_KEYS = {"SLURM_JOB_USER": "user", "SLURM_JOB_ACCOUNT": "account", "SLURM_JOB_PARTITION": "partition"}
#: written by the prolog for a reader that wants it; gpulse names users by SLURM_JOB_USER
OTHER_KEYS = ("SLURM_JOB_UID",)
_MAX_FILE = 64 * 1024


@dataclass(frozen=True)
class SlurmMapping:
    """One reading of the directory: GPU file name -> job ids, job id -> its job file's values."""

    gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    jobs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def holder(self, gpu: int, gpu_instance: int | None = None) -> Attribution | None:
        """The one job holding GPU ``gpu`` (its MIG instance's file first, if there is one), else None."""
        ids = self.gpus.get(f"{gpu}.{gpu_instance}") if gpu_instance is not None else None
        if ids is None:
            ids = self.gpus.get(str(gpu), ())
        if len(ids) != 1:
            return None
        return self.complete(Attribution(Scheduler.SLURM, ids[0]))

    def complete(self, job: Attribution) -> Attribution:
        """A Slurm job's missing user, account and partition from its job file; its id is never changed."""
        values = self.jobs.get(job.job) if job.scheduler is Scheduler.SLURM else None
        if not values:
            return job
        missing = {f: values[k] for k, f in JOB_KEYS.items() if values.get(k) and not getattr(job, f)}
        return replace(job, **missing) if missing else job


NO_MAPPING = SlurmMapping()


@dataclass(frozen=True)
class _Read:
    """A file as last read: its (size, mtime, inode) and its text (None: too large to be a mapping)."""

    signature: tuple[int, int, int]
    text: str | None


class SlurmJobFiles:
    """Reads :data:`DEFAULT_DIR` (or ``directory``) into a :class:`SlurmMapping`, cheaply, every call."""

    def __init__(
        self,
        directory: str = DEFAULT_DIR,
        *,
        min_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._said = CountedLog(log, period_s=3600.0)
        self._files: dict[str, _Read] = {}
        self._mapping = NO_MAPPING
        self._next = float("-inf")
        #: files read (not served from the cache) since the start: what a rescan cost
        self.reads = 0
        #: why the mapping is empty or partial as of the last scan (None when every file was used)
        self.problem: str | None = None

    def mapping(self) -> SlurmMapping:
        """The mapping as of the last scan within ``min_interval_s``; never raises."""
        now = self.clock()
        if now < self._next:
            return self._mapping
        self._next = now + self.min_interval_s
        try:
            self._mapping = self._scan()
        except OSError as e:
            self._files.clear()
            self._mapping = NO_MAPPING
            if isinstance(e, NotADirectoryError):
                self._say("not a directory", logging.WARNING, f"{self.directory} is not a directory; point "
                          "--slurm-job-dir (slurm_job_dir) at the directory deploy/slurm/prolog.sh writes")  # fmt: skip
            elif isinstance(e, FileNotFoundError):
                self._say("missing", logging.INFO, f"no Slurm job mapping in {self.directory} yet "
                          "(deploy/slurm/prolog.sh makes it with the first job that has a GPU)")  # fmt: skip
            else:
                self._say("unreadable", logging.WARNING, f"cannot read the Slurm job mapping in {self.directory}: "
                          f"{e.strerror or e}; run the agent as root or mount the directory readable")  # fmt: skip
        return self._mapping

    def _scan(self) -> SlurmMapping:
        self.problem = None
        st = os.stat(self.directory)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(20, "not a directory", self.directory)
        if not self._trusted(st, self.directory, "directory"):
            return NO_MAPPING
        gpus: dict[str, tuple[str, ...]] = {}
        jobs: dict[str, Mapping[str, str]] = {}
        seen: set[str] = set()
        with os.scandir(self.directory) as entries:
            for entry in entries:
                name = entry.name
                job = _JOB_FILE.match(name)
                if name.startswith("."):  # the prolog's temporary files and its lock
                    continue
                if not (_GPU_FILE.match(name) or job):
                    self._garbage(
                        "name", f"{name!r} is neither a GPU's file (<index> or <index>.<instance>) nor job_<id>"
                    )
                    continue
                seen.add(name)
                text = self._text(entry, name)
                if text is None:
                    continue
                if job is not None:
                    jobs[job.group(1)] = self._job_values(name, text)
                else:
                    gpus[name] = self._job_ids(name, text)
        for gone in set(self._files) - seen:
            del self._files[gone]
        return SlurmMapping(gpus, jobs)

    def _text(self, entry: os.DirEntry[str], name: str) -> str | None:
        """The file's text: read again only when its size, mtime or inode changed (or it just did)."""
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # removed by an epilog since the listing
            return None
        if not stat.S_ISREG(st.st_mode):
            self._garbage("type", f"{name!r} is not a regular file")
            return None
        if not self._trusted(st, os.path.join(self.directory, name), "file"):
            return None
        signature = (st.st_size, st.st_mtime_ns, st.st_ino)
        cached = self._files.get(name)
        if cached is not None and cached.signature == signature and not self._racy(st):
            if cached.text is None:
                self._garbage("size", f"{name!r} is larger than {_MAX_FILE} bytes")
            return cached.text
        try:
            with open(entry.path, "rb") as f:
                raw = f.read(_MAX_FILE + 1)
        except FileNotFoundError:  # removed by an epilog since the listing
            return None
        self.reads += 1
        text = raw.decode("utf-8", "replace") if len(raw) <= _MAX_FILE else None
        if text is None:
            self._garbage("size", f"{name!r} is larger than {_MAX_FILE} bytes")
        self._files[name] = _Read(signature, text)
        return text

    def _racy(self, st: os.stat_result) -> bool:
        """Changed within the file system's timestamp granularity of now: a same-size rewrite could hide."""
        return time.time_ns() - st.st_mtime_ns < 2_000_000_000

    def _job_ids(self, name: str, text: str) -> tuple[str, ...]:
        ids = []
        for line in text.splitlines():
            line = line.strip()
            if _JOB_ID.match(line):
                ids.append(line)
            elif line:
                self._garbage("job id", f"{name!r} holds {line[:40]!r}, which is not a Slurm job id")
        return tuple(dict.fromkeys(ids))

    def _job_values(self, name: str, text: str) -> dict[str, str]:
        values = {}
        for line in text.splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and (key in JOB_KEYS or key in OTHER_KEYS):
                values[key] = value.strip()
            elif line.strip():
                self._garbage("job line", f"{name!r} holds {line.strip()[:40]!r}, not one of "
                              f"{', '.join((*JOB_KEYS, *OTHER_KEYS))}=VALUE")  # fmt: skip
        return values

    def _trusted(self, st: os.stat_result, path: str, what: str) -> bool:
        if st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return True
        why = (
            f"the Slurm job mapping {what} {path} is ignored: it must belong to root and be writable by its "
            f"owner only (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}); chown root and chmod go-w it"
        )
        self._say(f"untrusted {what}", logging.WARNING, why)
        return False

    def _garbage(self, key: str, why: str) -> None:
        self._say(f"garbage:{key}", logging.WARNING, f"Slurm job mapping in {self.directory}: {why}; ignored")

    def _say(self, key: str, level: int, why: str) -> None:
        self.problem = why
        self._said.log(key, level, "%s", why)
