"""A Slurm task's initial environment completes its cgroup's job, where the kernel lets the agent read it.

Real processes throughout: children started with a known environment, and a reader without the
right to see another user's environment (the kernel's ptrace access check, proc_pid_environ(5)).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.waiting import wait_until

from gpulse.sources.attribution.cgroup import Attribution, Scheduler
from gpulse.sources.attribution.environ import GONE, Environ, parse_environ, read_environ
from gpulse.sources.attribution.podresources import PodHolder
from gpulse.sources.processes import job_tags, slurm_job

SLURM_ENV = {
    "SLURM_JOB_ID": "4343",
    "SLURM_JOB_SLUID": "s5K1KKYAYG5D00",
    "SLURM_JOB_USER": "ada",
    "SLURM_JOB_ACCOUNT": "physics",
    "SLURM_JOB_PARTITION": "gpu-long",
    "WANDB_API_KEY": "not-to-be-kept",
}


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], env=SLURM_ENV)
    # until execve, /proc/PID/environ is still the environment of the forked test process
    wait_until(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"), 10, "sleep's execve", 0.01)
    yield proc
    proc.kill()
    proc.wait()


def test_only_the_slurm_variables_of_a_process_environment_are_kept(child):
    env = read_environ("/proc", child.pid)
    assert not env.denied
    assert dict(env.values) == {k: v for k, v in SLURM_ENV.items() if k.startswith("SLURM_")}


def test_entries_without_a_value_separator_and_undecodable_bytes_do_not_break_parsing():
    raw = b"SLURM_JOB_ID=12\0garbage\0SLURM_JOB_ACCOUNT=\xff\xfe\0\0"
    assert parse_environ(raw) == {"SLURM_JOB_ID": "12", "SLURM_JOB_ACCOUNT": "\ufffd\ufffd"}


def read_as_another_user(pid: int) -> Environ:
    """``read_environ`` of ``pid`` by a process without the right to: nobody's (as root), else our own."""
    if os.geteuid() != 0:
        return read_environ("/proc", 1)  # init belongs to root
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setgid(65534)
            os.setuid(65534)
            env = read_environ("/proc", pid)
            os.write(w, b"denied" if env.denied else repr(dict(env.values)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        answer = f.read().decode()
    os.waitpid(child, 0)
    return Environ(denied=True) if answer == "denied" else Environ({"answer": answer})


def test_a_refused_read_is_an_answer_not_an_exception(child):
    assert read_as_another_user(child.pid) == Environ(denied=True)


def test_a_process_that_is_gone_has_an_empty_environment():
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert read_environ("/proc", proc.pid) == GONE


SLUID_JOB = Attribution(Scheduler.SLURM, "s5K1KKYAYG5D00", step="0", sluid="s5K1KKYAYG5D00")


def test_a_sluid_directory_maps_to_the_job_id_through_the_tasks_environment():
    job = slurm_job(
        SLUID_JOB, Environ(parse_environ(b"\0".join(f"{k}={v}".encode() for k, v in SLURM_ENV.items()))), "ada"
    )
    assert (job.job, job.user, job.account, job.partition) == ("4343", "ada", "physics", "gpu-long")


def test_without_the_environment_the_cgroup_alone_names_the_job():
    assert slurm_job(SLUID_JOB, Environ(denied=True), "ada").job == "s5K1KKYAYG5D00"
    v1 = Attribution(Scheduler.SLURM, "77", step="0", uid=1000)
    assert slurm_job(v1, Environ(denied=True), "bob") == Attribution(
        Scheduler.SLURM, "77", step="0", uid=1000, user="bob"
    )


def test_an_environment_of_another_job_cannot_rename_or_relabel_the_cgroups_job():
    """The kernel placed the process in job 4242; what its environment says of job 4343 is not used."""
    job = slurm_job(Attribution(Scheduler.SLURM, "4242", step="0"), Environ(dict(SLURM_ENV)), None)
    assert (job.job, job.user, job.account, job.partition) == ("4242", None, None, None)
    other_sluid = Attribution(Scheduler.SLURM, "sAAAAAAAAAAAAA", step="0", sluid="sAAAAAAAAAAAAA")
    assert slurm_job(other_sluid, Environ(dict(SLURM_ENV)), None).job == "sAAAAAAAAAAAAA"


def test_the_owner_from_the_kernel_wins_over_slurm_job_user():
    job = slurm_job(Attribution(Scheduler.SLURM, "4343"), Environ(dict(SLURM_ENV)), "root")
    assert job.user == "root"
    assert slurm_job(Attribution(Scheduler.SLURM, "4343"), Environ(dict(SLURM_ENV)), None).user == "ada"


def test_job_tags_name_a_pod_only_for_a_pod_process_or_a_gpu_without_one():
    holder = PodHolder("ml", "trainer-0", "main")
    slurm = Attribution(Scheduler.SLURM, "4343", user="ada", account="physics")
    pod = Attribution(Scheduler.KUBERNETES, "uid-1", pod_uid="uid-1")
    assert job_tags(slurm, holder) == {"job": "4343", "job_user": "ada", "account": "physics"}
    assert job_tags(pod, holder) == {"job": "uid-1", "pod": "trainer-0", "namespace": "ml"}
    assert job_tags(None, holder) == {"pod": "trainer-0", "namespace": "ml"}
    assert job_tags(None, None) == {}
