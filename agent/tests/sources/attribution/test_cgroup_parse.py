"""Which job a process runs in, read from the cgroup paths Slurm's and the kubelet's daemons create.

The paths are the layouts documented in ``sources/attribution/cgroup.py`` (Slurm's cgroup/v1 and
cgroup/v2 plugins, the kubelet's systemd and cgroupfs drivers with containerd and CRI-O), written
as ``/proc/PID/cgroup`` shows them; ``test_real_cgroups.py`` has the kernel write them.
"""

from __future__ import annotations

import pytest

from gpulse.sources.attribution.cgroup import Attribution, Scheduler, parse

POD = "6a1e3c0b-2f4d-4e8a-9b1c-0d2e4f6a8b0c"
CID = "0f" * 32


@pytest.mark.parametrize(
    ("text", "job", "step", "uid", "sluid"),
    [
        ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", "4242", "0", None, None),
        ("0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_special\n", "7", "batch", None, None),
        ("0::/system.slice/node3_slurmstepd.scope/job_7/step_extern/user/task_0\n", "7", "extern", None, None),
        (
            "0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_1\n",
            "s5K1KKYAYG5D00",
            "0",
            None,
            "s5K1KKYAYG5D00",
        ),
        ("8:pids:/slurm/uid_1000/job_77/step_3/task_0\n0::/\n", "77", "3", 1000, None),
        ("4:memory:/slurm_node3/uid_0/job_78/step_interactive/task_0\n", "78", "interactive", 0, None),
    ],
)
def test_a_slurm_task_is_attributed_to_its_job_from_every_cgroup_layout(text, job, step, uid, sluid):
    assert parse(text) == Attribution(Scheduler.SLURM, job, step=step, uid=uid, sluid=sluid)


@pytest.mark.parametrize(
    ("text", "container"),
    [
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope\n",
            CID,
        ),
        (f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{CID}.scope\n", CID),  # Guaranteed
        (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD.replace('-', '_')}.slice\n", None),
        (f"11:pids:/kubepods/burstable/pod{POD}/{CID}\n0::/\n", CID),
        (f"5:cpu:/kubepods/pod{POD}/{CID}\n", CID),  # Guaranteed, cgroupfs
        # read from inside the agent's own cgroup namespace: relative to the agent's cgroup
        (f"0::/../../kubepods-besteffort-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n", CID),
        (f"0::/../../pod{POD}/{CID}\n", CID),
    ],
)
def test_a_pod_container_is_attributed_to_its_pod_uid_from_systemd_and_cgroupfs_layouts(text, container):
    assert parse(text) == Attribution(Scheduler.KUBERNETES, POD, pod_uid=POD, container=container)


@pytest.mark.parametrize(
    "text",
    [
        "0::/\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        f"0::/system.slice/docker-{CID}.scope\n",
        "0::/system.slice/slurmd.service\n",  # the daemon, not a job
        "0::/system.slice/slurmstepd.scope/system\n",  # idle stepds
        "0::/home/job_42/step_0\n",  # a look-alike outside Slurm's scope
        f"0::/user.slice/mypod{POD}/x\n",  # "pod" must begin a directory name
        "0::/kubepods/burstable/podnot-a-uid/x\n",
        "garbage without colons\n",
        "",
    ],
)
def test_a_process_of_no_job_has_no_attribution(text):
    assert parse(text) is None
