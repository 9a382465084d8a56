"""A rank's training points carry the job holding the GPUs it registered, when the rank names none.

A process in a Kubernetes pod sees its own cgroup as ``0::/`` and cannot learn its pod's UID; the
agent knows which job holds each GPU (the ``job`` tag of its ``gpu`` points) and which GPUs each
rank registered, so it tags the rank's ``train_*`` points. Driven through ``handle_datagram`` (the
receiver's public entry for one datagram) and the agent loop's :func:`gpu_jobs`.
"""

from __future__ import annotations

import os
import socket
import time

import pytest
from support import cgroups
from training_support import wait_for

from gpulse.agent.loop import gpu_jobs
from gpulse.channel import protocol
from gpulse.channel.server import TrainingReceiver
from gpulse.lineprotocol.parse import parse_line
from gpulse.sources.base import GpuIdentity, Reading
from gpulse.sources.processes import ProcessDescriber

POD = "0f4c2b9e-1d2a-4c3b-9e8f-7a6b5c4d3e2f"
OTHER = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def tags(rank: str, **extra: str) -> dict[str, str]:
    return {"run": "r1", "rank": rank, "local_rank": rank, "world_size": "2", **extra}


class Submitted:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, lines: list[str]) -> int:
        self.lines.extend(lines)
        return len(self.lines)

    def jobs(self) -> list[str | None]:
        return [parse_line(line).tags.get("job") for line in self.lines]


def receiver(submitted: Submitted) -> TrainingReceiver:
    rx = TrainingReceiver("/nonexistent/agent.sock", "node1", submitted)  # never started: no socket needed
    pid = os.getpid()
    rx.handle_datagram(protocol.encode(protocol.Register("r1", "0", pid, ("GPU-a", "GPU-b"), seq=1)))
    rx.handle_datagram(protocol.encode(protocol.Register("r1", "1", pid, ("GPU-c",), seq=2)))
    return rx


def step(rank: str, seq: int, **extra: str) -> bytes:
    point = protocol.Point("train_step", time.time_ns(), tags(rank, **extra), {"step": seq, "step_time_s": 0.1}, seq)
    return protocol.encode(point)


def test_a_ranks_points_get_the_job_holding_all_the_gpus_it_registered():
    sent = Submitted()
    rx = receiver(sent)
    rx.note_gpu_jobs({"GPU-a": POD, "GPU-b": POD, "GPU-c": OTHER})
    rx.handle_datagram(step("0", 3))
    rx.handle_datagram(step("1", 4))
    assert sent.jobs() == [POD, OTHER]
    assert parse_line(sent.lines[0]).tags == {**tags("0"), "host": "node1", "job": POD}


def test_a_job_the_rank_names_itself_is_kept():
    sent = Submitted()
    rx = receiver(sent)
    rx.note_gpu_jobs({"GPU-a": POD, "GPU-b": POD})
    rx.handle_datagram(step("0", 3, job="4242"))
    assert sent.jobs() == ["4242"]


def test_no_job_when_the_gpus_are_held_by_two_jobs_or_by_none_or_the_rank_registered_none():
    sent = Submitted()
    rx = receiver(sent)
    rx.note_gpu_jobs({"GPU-a": POD, "GPU-b": OTHER})
    rx.handle_datagram(step("0", 3))
    rx.note_gpu_jobs({"GPU-a": POD})  # GPU-b held by no job
    rx.handle_datagram(step("0", 4))
    rx.note_gpu_jobs({"GPU-a": POD, "GPU-b": POD})
    rx.handle_datagram(step("2", 5))  # rank 2 never registered
    assert sent.jobs() == [None, None, None]


def test_the_tag_follows_the_gpus_when_their_job_changes_and_goes_when_the_rank_unregisters():
    sent = Submitted()
    rx = receiver(sent)
    rx.note_gpu_jobs({"GPU-c": POD})
    rx.handle_datagram(step("1", 3))
    rx.note_gpu_jobs({"GPU-c": OTHER})
    rx.handle_datagram(step("1", 4))
    rx.handle_datagram(protocol.encode(protocol.Unregister("r1", "1", os.getpid(), seq=5)))
    rx.handle_datagram(step("1", 6))
    assert sent.jobs() == [POD, OTHER, None]


def test_the_agent_loop_reads_each_gpus_job_from_its_gpu_reading():
    gpus = [GpuIdentity(0, "GPU-a", "H100"), GpuIdentity(1, "GPU-b", "H100")]
    readings = [
        Reading("gpu", 0, {"sm_util_pct": 90.0}, 1, {"job": POD, "pod": "train-0"}),
        Reading("gpu", 1, {"sm_util_pct": 0.0}, 1, None),
        Reading("gpu_process", 1, {"pid": 7}, 1, {"job": OTHER}),  # a process is not the GPU's holder
    ]
    assert gpu_jobs(readings, gpus) == {"GPU-a": POD}


def start(rank: str, pid: int, seq: int, **extra: str) -> bytes:
    fields = {"event": "start", "status": "running", "name": "r", "pid": pid}
    return protocol.encode(protocol.Point("train_run", time.time_ns(), tags(rank, **extra), fields, seq))


def test_a_rank_cannot_name_the_account_by_which_tenants_are_routed():
    sent = Submitted()
    rx = receiver(sent)
    rx.handle_datagram(step("0", 3, account="a-team"))
    rx.handle_datagram(step("0", 4, namespace="b-team"))
    assert sent.lines == [] and rx.rejected["reserved_tag"] == 2


def test_a_start_point_that_gives_its_rank_a_job_counts_its_dropped_fields_once():
    """The start point is tagged again with the job it just gave its rank; its fields are not checked twice."""
    sent = Submitted()
    rx = TrainingReceiver("/nonexistent/agent.sock", "node1", sent, attribute=lambda pid: {"job": "777"})
    point = protocol.Point(
        "train_run",
        time.time_ns(),
        tags("0"),
        {"event": "start", "status": "running", "name": "r", "pid": os.getpid(), "bogus": 1},
        1,
    )
    rx.handle_datagram(protocol.encode(point))
    assert [parse_line(line).tags.get("job") for line in sent.lines] == ["777"]
    assert rx.stats()["values_dropped_by_cause"] == {"unknown_field": 1}


@pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable()))
def test_from_its_start_point_a_ranks_points_carry_the_job_and_account_of_its_process_as_the_kernel_names_them():
    tree = cgroups.CgroupTree()
    try:
        v2 = cgroups.v2_root()
        assert v2 is not None
        env = {"SLURM_JOB_ID": "777", "SLURM_JOB_ACCOUNT": "a-team"}
        proc = tree.start(v2, "system.slice/slurmstepd.scope/job_777/step_0/user/task_0", env)
        sent = Submitted()
        rx = TrainingReceiver("/nonexistent/agent.sock", "node1", sent, attribute=ProcessDescriber().job_tags)
        rx.handle_datagram(start("0", proc.pid, 1, job="4242"))  # SLURM_JOB_ID can say anything: the cgroup wins
        rx.handle_datagram(step("0", 2, job="4242"))
        rx.handle_datagram(step("1", 3))  # another rank, whose process the agent was not told
    finally:
        tree.close()
    assert [(p.measurement, p.tags.get("job"), p.tags.get("account")) for p in map(parse_line, sent.lines)] == [
        ("train_run", "777", "a-team"),
        ("train_step", "777", "a-team"),
        ("train_step", None, None),
    ]


@pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable()))
def test_a_run_naming_another_jobs_process_gets_its_own_job_not_that_ones(tmp_path):
    """Over the real socket the kernel names the sender (``SCM_CREDENTIALS``): the pid a start point names is not taken."""
    sent = Submitted()
    rx = TrainingReceiver(str(tmp_path / "run" / "agent.sock"), "node1", sent, attribute=ProcessDescriber().job_tags)
    with cgroups.CgroupTree() as tree:
        v2 = cgroups.v2_root()
        assert v2 is not None
        env = {"SLURM_JOB_ID": "777", "SLURM_JOB_ACCOUNT": "a-team"}
        other = tree.start(v2, "system.slice/slurmstepd.scope/job_777/step_0/user/task_0", env)
        rx.start()
        try:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            # this test's process, in no Slurm job, names job 777's process and job 777 itself
            client.sendto(start("0", other.pid, 1, job="777"), rx.path)
            client.sendto(step("0", 2, job="777"), rx.path)
            assert wait_for(lambda: len(sent.lines) == 2)
            client.close()
        finally:
            rx.close()
    assert [(p.measurement, p.tags.get("job"), p.tags.get("account")) for p in map(parse_line, sent.lines)] == [
        ("train_run", None, None),
        ("train_step", None, None),
    ]
