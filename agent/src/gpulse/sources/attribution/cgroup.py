"""``/proc/PID/cgroup`` to the job that owns the process: Slurm's and the kubelet's cgroup layouts.

The cgroup path is set by the scheduler's root daemon, not by the job, so it is the attribution a
job cannot forge. Layouts recognised (SchedMD/slurm, kubernetes/kubernetes and containerd sources):

* Slurm, cgroup v2 (``src/plugins/cgroup/v2/cgroup_v2.c``): ``…/[<node>_]slurmstepd.scope/<JOBDIR>/step_<id>/user/task_<n>``,
  where ``<JOBDIR>`` is ``job_<id>`` up to 25.x and the job's SLUID (``s`` and 13 characters,
  e.g. ``s5K1KKYAYG5D00``) from 26.05; the SLUID maps to the job id through ``SLURM_JOB_SLUID``.
* Slurm, cgroup v1 (``src/plugins/cgroup/v1/xcgroup.c``): ``/<prepend, /slurm or /slurm_<node>>/uid_<uid>/job_<id>/step_<id>/task_<n>``.
* kubelet, systemd driver (``pkg/kubelet/cm/cgroup_manager_linux.go``): ``kubepods[-<qos>]-pod<uid, - as _>.slice``,
  container leaf ``cri-containerd-<id>.scope`` (containerd) or ``crio-<id>.scope`` (CRI-O).
* kubelet, cgroupfs driver: ``/kubepods[/burstable|/besteffort]/pod<uid>/<container id>``
  (containerd's ``internal/cri/server/podsandbox/helpers_linux.go`` getCgroupsPath names the leaves).

An agent in a container of its own cgroup namespace (containerd's default on cgroup v2, also with
``hostPID``) reads paths relative to its own cgroup (``/../../pod<uid>/<id>``): the pod directory
is then matched without its ``kubepods`` parents, as dcgm-exporter's ``pod<uid>`` match does.

Pure parsing: the caller reads the file; a process of none of these is ``None``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Scheduler(enum.Enum):
    SLURM = "slurm"
    KUBERNETES = "kubernetes"


@dataclass(frozen=True)
class Attribution:
    """The job a process runs in. ``job`` is the Slurm job id (the SLUID until it is mapped) or the pod UID."""

    scheduler: Scheduler
    job: str
    step: str | None = None
    #: the job's uid where the path names it (Slurm cgroup v1)
    uid: int | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    #: the Slurm job's SLUID when its cgroup directory is named by it (26.05 and later)
    sluid: str | None = None
    pod_uid: str | None = None
    #: container id (kubelet layouts) or, once the kubelet named it, the container's name
    container: str | None = None
    #: pod name and namespace, known only through the kubelet's pod-resources API
    pod: str | None = None
    namespace: str | None = None


_SLURM_V2 = re.compile(
    r"/(?:[^/]+_)?slurmstepd\.scope/(?:job_(?P<job>\d+)|(?P<sluid>s[0-9A-Z]{13}))/step_(?P<step>[^/]+)(?:/|$)"
)
_SLURM_V1 = re.compile(r"/slurm(?:_[^/]+)?/uid_(?P<uid>\d+)/job_(?P<job>\d+)(?:/step_(?P<step>[^/]+))?(?:/|$)")
_POD_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_K8S_SYSTEMD = re.compile(
    rf"/kubepods(?:-[a-z]+)?-pod(?P<pod>{_POD_UID})\.slice(?:/(?:cri-containerd|crio|docker)-(?P<cid>[0-9a-f]{{64}})\.scope)?"
)
_K8S_CGROUPFS = re.compile(rf"/pod(?P<pod>{_POD_UID})(?:/(?P<cid>[0-9a-f]{{64}}))?(?:/|$)")


def cgroup_paths(text: str) -> list[str]:
    """The paths of a ``/proc/PID/cgroup`` file (``hierarchy-ID:controllers:path`` per line; v2 is ``0::path``)."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            out.append(parts[2])
    return out


def parse(text: str) -> Attribution | None:
    """The job of the process whose ``/proc/PID/cgroup`` is ``text``; ``None`` outside Slurm and Kubernetes."""
    for path in cgroup_paths(text):
        found = parse_path(path)
        if found is not None:
            return found
    return None


def parse_path(path: str) -> Attribution | None:
    """One cgroup path to its job, or ``None``."""
    m = _SLURM_V2.search(path)
    if m:
        sluid = m["sluid"]
        return Attribution(Scheduler.SLURM, m["job"] or sluid, step=m["step"], sluid=sluid)
    m = _SLURM_V1.search(path)
    if m:
        return Attribution(Scheduler.SLURM, m["job"], step=m["step"], uid=int(m["uid"]))
    m = _K8S_SYSTEMD.search(path) or _K8S_CGROUPFS.search(path)
    if m:
        uid = m["pod"].replace("_", "-")
        return Attribution(Scheduler.KUBERNETES, uid, pod_uid=uid, container=m["cid"])
    return None
