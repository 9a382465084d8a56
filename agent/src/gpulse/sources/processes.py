"""Who a GPU process is: command and user from /proc, its Docker container, and the job it runs in.

NVML reports host PIDs (the driver ignores PID namespaces), so this reads the host's
``/proc``; an agent in a container needs ``--pid=host``, otherwise the lookups find nothing and
the fields are simply absent. The container id comes from ``/proc/PID/cgroup`` (cgroup v1
``/docker/<id>``, v2 ``/docker/<id>`` or systemd ``docker-<id>.scope``) and is named through the
Docker Engine API when its socket is reachable; otherwise the 12-character id is used. Nothing
here raises: a vanished process or an unreachable engine only leaves a field empty.

The job comes from the kernel (``sources/attribution``): the Slurm job or Kubernetes pod named by
the process's cgroup, completed from its initial environment (Slurm account and partition, the
SLUID's job id) where the kernel lets us read it, from the kubelet's pod-resources API (pod
name and namespace) where its socket is mounted, and from a Slurm prolog's GPU-to-job mapping
where configured (``attribution/slurm_files``: the job of a process whose cgroup names none). :func:`job_tags` is the one place that turns that
into the optional tags of ``gpu_process`` and ``gpu``.

Details are cached by (pid, start time), never by pid alone, so a reused PID is not mistaken for
the old process.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpulse.sources.attribution import cgroup
from gpulse.sources.attribution.cgroup import Attribution, Scheduler
from gpulse.sources.attribution.environ import Environ, read_environ
from gpulse.sources.attribution.podresources import PodHolder, PodResources
from gpulse.sources.attribution.slurm_files import NO_MAPPING, SlurmJobFiles, SlurmMapping

log = logging.getLogger(__name__)

_DOCKER_ID = re.compile(r"(?:/docker/|docker-)([0-9a-f]{64})(?:\.scope)?(?=/|$)", re.MULTILINE)
_MAX_CACHE = 4096


@dataclass(frozen=True)
class ProcessDetails:
    command: str | None
    user: str | None
    container: str | None
    job: Attribution | None = None


NOTHING = ProcessDetails(None, None, None)


def slurm_job(a: Attribution, env: Environ, owner: str | None) -> Attribution:
    """A Slurm cgroup's job completed from the task's initial environment.

    The cgroup decides the job; the environment is used only where it belongs to that job (its
    ``SLURM_JOB_ID``, or ``SLURM_JOB_SLUID`` for a SLUID directory), so a process cannot claim
    another job. The user is the uid in the cgroup path, else the process's owner, else ``SLURM_JOB_USER``.
    """
    v = env.values
    if a.sluid is not None and v.get("SLURM_JOB_SLUID") == a.sluid and v.get("SLURM_JOB_ID", "").isdigit():
        a = replace(a, job=v["SLURM_JOB_ID"])
    mine = v.get("SLURM_JOB_ID") == a.job
    return replace(
        a,
        user=owner or (v.get("SLURM_JOB_USER") if mine else None),
        account=v.get("SLURM_JOB_ACCOUNT") if mine else None,
        partition=v.get("SLURM_JOB_PARTITION") if mine else None,
    )


def job_tags(job: Attribution | None, holder: PodHolder | None) -> dict[str, str]:
    """The optional tags (``schema.JOB_TAGS``) of a process in ``job`` on a GPU the kubelet gave to ``holder``.

    A holder names the pod only of a process of Kubernetes (or of a GPU with no process seen)."""
    tags: dict[str, str] = {}
    if job is not None:
        tags["job"] = job.job
        for key, value in (("job_user", job.user), ("account", job.account), ("partition", job.partition)):
            if value:
                tags[key] = value
    if holder is not None and (job is None or job.scheduler is Scheduler.KUBERNETES):
        tags["pod"], tags["namespace"] = holder.pod, holder.namespace
    return tags


def container_id_from_cgroup(text: str) -> str | None:
    """The (outermost) Docker container id in a /proc/PID/cgroup file, or None."""
    m = _DOCKER_ID.search(text)
    return m.group(1) if m else None


def _default_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    return host[len("unix://") :] if host.startswith("unix://") else "/var/run/docker.sock"


def container_of(d: ProcessDetails, holder: PodHolder | None) -> str | None:
    """The ``container`` field: Docker's name; in a pod, the kubelet's name for it, else its short id."""
    if d.job is None or d.job.scheduler is not Scheduler.KUBERNETES:
        return d.container
    if holder is not None and holder.container:
        return holder.container
    return d.container or (d.job.container[:12] if d.job.container else None)


class ContainerNamer:
    """Container id → name through the Docker Engine API, cached; the short id when it can't.

    ``client_factory`` returns a ``docker.DockerClient``-like object (``.containers.get(id).name``);
    tests pass a fake one. Failures are remembered for ``retry_s`` so a dead engine costs one
    short timeout per minute, not one per process.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        timeout: float = 1.0,
        client_factory: Callable[[], Any] | None = None,
        retry_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path or _default_socket()
        self.timeout = timeout
        self._factory = client_factory or self._docker_client
        self.retry_s = retry_s
        self.clock = clock
        self._client: Any = None
        self._client_retry_at = 0.0
        self._names: dict[str, tuple[str, float | None]] = {}  # id -> (name, expiry or None)
        self.lookups = 0
        self.failures = 0

    def _docker_client(self) -> Any:
        if not os.path.exists(self.socket_path):
            return None
        import docker  # heavy import, only when a container process shows up

        return docker.DockerClient(base_url=f"unix://{self.socket_path}", timeout=self.timeout)

    def _get_client(self) -> Any:
        if self._client is None and self.clock() >= self._client_retry_at:
            try:
                self._client = self._factory()
            except Exception as e:
                log.info("Docker engine unreachable (%s); using container ids", e)
                self._client = None
            if self._client is None:
                self._client_retry_at = self.clock() + self.retry_s
        return self._client

    def name(self, container_id: str) -> str:
        cached = self._names.get(container_id)
        if cached is not None and (cached[1] is None or self.clock() < cached[1]):
            return cached[0]
        short = container_id[:12]
        client = self._get_client()
        if client is None:
            self._remember(container_id, short, self.clock() + self.retry_s)
            return short
        self.lookups += 1
        try:
            name = str(client.containers.get(container_id).name).lstrip("/") or short
        except Exception as e:
            self.failures += 1
            if not type(e).__name__ == "NotFound":  # the engine itself failed: reconnect later
                self._client = None
                self._client_retry_at = self.clock() + self.retry_s
            self._remember(container_id, short, self.clock() + self.retry_s)
            return short
        self._remember(container_id, name, None)
        return name

    def _remember(self, cid: str, name: str, expiry: float | None) -> None:
        if len(self._names) > _MAX_CACHE:
            self._names.clear()
        self._names[cid] = (name, expiry)


class ProcessDescriber:
    """Reads command, user and container of host PIDs from ``proc_root``."""

    def __init__(
        self,
        proc_root: str = "/proc",
        namer: ContainerNamer | None = None,
        max_command: int = 256,
        pods: PodResources | None = None,
        slurm: SlurmJobFiles | None = None,
    ) -> None:
        self.proc_root = proc_root
        self.namer = namer if namer is not None else ContainerNamer()
        #: the kubelet's pod-resources API (answers nothing where its socket is not mounted)
        self.pods = pods if pods is not None else PodResources()
        #: a Slurm prolog's GPU-to-job mapping (``--slurm-job-dir``), where configured
        self.slurm = slurm
        self.max_command = max_command
        self._cache: dict[tuple[int, int], ProcessDetails] = {}
        self._users: dict[int, str] = {}

    def slurm_mapping(self) -> SlurmMapping:
        """The prolog's GPU-to-job mapping as of now; empty where none is configured."""
        return self.slurm.mapping() if self.slurm is not None else NO_MAPPING

    def describe(self, pid: int) -> ProcessDetails:
        base = f"{self.proc_root}/{pid}"
        start = self._start_time(base)
        if start is None:
            return NOTHING
        key = (pid, start)
        d = self._cache.get(key)
        if d is None:
            if len(self._cache) > _MAX_CACHE:
                self._cache.clear()
            text = self._read(f"{base}/cgroup") or ""
            user = self._user(base)
            d = ProcessDetails(self._command(base), user, self._container(text), self._job(pid, text, user))
            self._cache[key] = d
        return d

    def job_tags(self, pid: int) -> dict[str, str] | None:
        """The job tags of process ``pid`` from its cgroup and initial environment alone (no pod holder, no
        container name): what the agent gives a training rank's points, which NVML may never list (CPU runs).
        ``None`` when the process cannot be read (gone, or in a PID namespace the agent does not see)."""
        base = f"{self.proc_root}/{pid}"
        start = self._start_time(base) if pid > 0 else None
        if start is None:
            return None
        return job_tags(self._job(pid, self._read(f"{base}/cgroup") or "", self._user(base)), None)

    @staticmethod
    def _read(path: str) -> str | None:
        try:
            with open(path, "rb") as f:
                return f.read(65536).decode("utf-8", "replace")
        except OSError:
            return None

    def _start_time(self, base: str) -> int | None:
        stat = self._read(f"{base}/stat")
        if not stat:
            return None
        # the command in field 2 may hold spaces and parentheses: split after the last ')'
        rest = stat[stat.rfind(")") + 2 :].split()
        try:
            return int(rest[19])  # field 22, starttime
        except (IndexError, ValueError):
            return None

    def _command(self, base: str) -> str | None:
        raw = self._read(f"{base}/cmdline")
        cmd = " ".join(p for p in (raw or "").split("\0") if p).strip()
        if not cmd:
            cmd = (self._read(f"{base}/comm") or "").strip()
            cmd = f"[{cmd}]" if cmd else ""
        return cmd[: self.max_command] or None

    def _user(self, base: str) -> str | None:
        uid: int | None = None
        status = self._read(f"{base}/status")
        if status:
            for line in status.splitlines():
                if line.startswith("Uid:"):
                    parts = line.split()
                    uid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
                    break
        if uid is None:
            try:
                uid = os.stat(base).st_uid
            except OSError:
                return None
        return self._user_name(uid)

    def _user_name(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name

    def _job(self, pid: int, cgroup_text: str, user: str | None) -> Attribution | None:
        job = cgroup.parse(cgroup_text)
        if job is not None and job.scheduler is Scheduler.SLURM:
            owner = self._user_name(job.uid) if job.uid is not None else user
            job = slurm_job(job, read_environ(self.proc_root, pid), owner)
        return job

    def _container(self, cgroup_text: str) -> str | None:
        cid = container_id_from_cgroup(cgroup_text)
        if cid is None:
            return None
        try:
            return self.namer.name(cid)
        except Exception:  # a namer must never break sampling
            return cid[:12]
