"""GPU processes in real cgroups of Slurm's and the kubelet's layouts reach the database tagged with their job.

The kernel does the attributing part: each process is a real ``sleep`` moved into a cgroup made
here with the layout the scheduler's daemon makes (Slurm cgroup v2 with a ``job_<id>`` and a SLUID
directory, Slurm cgroup v1 under the ``pids`` hierarchy, the kubelet's systemd driver with
containerd and CRI-O leaves and its cgroupfs driver), so ``/proc/PID/cgroup`` is the kernel's. The
NVML stand-in puts those PIDs on its GPUs, and the real agent (loop, NVML source, process
describer, encoder, delivery, record sink) samples them for a few cycles.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import cgroups
from support.fake_pynvml import h100
from support.nvml_agent import newest_tags, record_agent

from gpulse.sources.attribution.podresources import PodResources
from gpulse.sources.processes import ProcessDescriber

pytestmark = pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable()))

POD_A = "6a1e3c0b-2f4d-4e8a-9b1c-0d2e4f6a8b0c"
POD_B = "7b2f4d1c-3a5e-4f9b-8c2d-1e3f5a7b9c1d"
POD_C = "8c3a5e2d-4b6f-4a1c-9d3e-2f4a6b8c0d2e"
CID = "c0ffee" + "0" * 58


@pytest.fixture
def tree() -> Iterator[cgroups.CgroupTree]:
    t = cgroups.CgroupTree()
    try:
        yield t
    finally:
        t.close()


def slurm_env(job: str, **more: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": job, "SLURM_JOB_ACCOUNT": f"acct-{job}", "SLURM_JOB_PARTITION": "gpu", **more}


def test_each_gpu_process_and_its_gpu_carry_the_job_the_kernel_put_it_in(tree, tmp_path, monkeypatch):
    v2, v1 = cgroups.v2_root(), cgroups.v1_root()
    assert v2 is not None and v1 is not None
    scope = "system.slice/slurmstepd.scope"
    pods = "kubepods.slice/kubepods-burstable.slice"
    procs = [
        tree.start(v2, f"{scope}/job_4242/step_0/user/task_0", slurm_env("4242")),
        tree.start(
            v2, f"{scope}/s5K1KKYAYG5D00/step_batch/user/task_0", slurm_env("4343", SLURM_JOB_SLUID="s5K1KKYAYG5D00")
        ),
        tree.start(v1, "slurm/uid_0/job_77/step_3/task_0", slurm_env("77")),
        tree.start(v2, f"{pods}/kubepods-burstable-pod{POD_A.replace('-', '_')}.slice/cri-containerd-{CID}.scope"),
        tree.start(v2, f"kubepods.slice/kubepods-pod{POD_B.replace('-', '_')}.slice/crio-{CID}.scope"),
        tree.start(v1, f"kubepods/besteffort/pod{POD_C}/{CID}"),
    ]
    for p in procs:  # the kernel's own record of where each process is
        assert tree.name in Path(f"/proc/{p.pid}/cgroup").read_text()
    gpus = [h100(i, compute_procs=[(p.pid, 1 << 30)]) for i, p in enumerate(procs)]
    gpus.append(h100(len(procs)))  # nobody's GPU
    describer = ProcessDescriber(pods=PodResources(str(tmp_path / "no-kubelet.sock")))

    points = record_agent(tmp_path, monkeypatch, gpus, describer)

    processes = newest_tags(points, "gpu_process")
    expected = {
        "0": {"job": "4242", "job_user": "root", "account": "acct-4242", "partition": "gpu"},
        "1": {"job": "4343", "job_user": "root", "account": "acct-4343", "partition": "gpu"},  # SLUID mapped
        "2": {"job": "77", "job_user": "root", "account": "acct-77", "partition": "gpu"},  # uid_0 in the path
        "3": {"job": POD_A},
        "4": {"job": POD_B},
        "5": {"job": POD_C},
    }
    job_keys = ("job", "job_user", "account", "partition", "pod", "namespace")
    assert {g: {k: v for k, v in t.items() if k in job_keys} for g, t in processes.items()} == expected
    containers = {
        p.tags["gpu"]: p.fields.get("container")
        for p in points
        if p.measurement == "gpu_process" and p.tags["gpu"] >= "3"
    }
    assert containers == {"3": CID[:12], "4": CID[:12], "5": CID[:12]}
    # the GPU's own series carries the job holding it (from the first process sample on)
    held = newest_tags(points, "gpu")
    assert {g: held[g].get("job") for g in held} == {**{g: e["job"] for g, e in expected.items()}, "6": None}
    assert held["0"]["account"] == "acct-4242" and "job" not in held["6"]
    assert all(p.returncode is None for p in procs)  # still running: the tags came from live processes
    assert os.path.isdir(v2 / tree.name)


READER = """
import json, sys
from gpulse.sources.attribution.podresources import PodResources
from gpulse.sources.processes import ProcessDescriber
describer = ProcessDescriber(pods=PodResources("/nonexistent/kubelet.sock"))
out = {}
for pid in sys.argv[1:]:
    job = describer.describe(int(pid)).job
    out[pid] = [open(f"/proc/{pid}/cgroup").read(), job and job.job, job and job.container]
print(json.dumps(out))
"""


def test_an_agent_in_its_own_cgroup_namespace_attributes_pods_from_relative_paths(tree):
    """A containerised agent (containerd's private cgroup namespace, hostPID) sees ``/../../pod<uid>/<id>``."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) (util-linux) to enter a cgroup namespace")
    v2, v1 = cgroups.v2_root(), cgroups.v1_root()
    assert v2 is not None and v1 is not None
    agent_pod = "0d0d0d0d-1e1e-4f4f-8a8a-2b2b2b2b2b2b"
    pods = "kubepods.slice/kubepods-burstable.slice"
    in_pod_a = tree.start(
        v2, f"{pods}/kubepods-burstable-pod{POD_A.replace('-', '_')}.slice/cri-containerd-{CID}.scope"
    )
    in_pod_c = tree.start(v1, f"kubepods/besteffort/pod{POD_C}/{CID}")
    agent_v2 = tree.make(
        v2,
        f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{agent_pod.replace('-', '_')}.slice/cri-containerd-{'a' * 64}.scope",
    )
    agent_v1 = tree.make(v1, f"kubepods/besteffort/pod{agent_pod}/{'a' * 64}")
    enter = f'echo $$ > {agent_v2}/cgroup.procs && echo $$ > {agent_v1}/cgroup.procs && exec unshare --cgroup "$@"'
    r = subprocess.run(
        ["sh", "-c", enter, "sh", sys.executable, "-c", READER, str(in_pod_a.pid), str(in_pod_c.pid)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    seen = json.loads(r.stdout)
    a, c = seen[str(in_pod_a.pid)], seen[str(in_pod_c.pid)]
    assert (
        "0::/../../../kubepods-burstable.slice/" in a[0] and "kubepods.slice" not in a[0]
    )  # the kernel's relative view
    assert f"pids:/../../pod{POD_C}/{CID}" in c[0]
    assert (a[1], a[2]) == (POD_A, CID) and (c[1], c[2]) == (POD_C, CID)
