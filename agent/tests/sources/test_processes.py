"""Who a GPU process is: /proc parsing and Docker container naming.

Fake /proc trees in temp dirs stand in for the host's /proc (the files have the kernel's formats);
a fake client object with the docker SDK's shape (``client.containers.get(id).name``, raising
``docker.errors.NotFound``) stands in for the Docker Engine, which CI does not have.
"""

from __future__ import annotations

from pathlib import Path

import docker.errors
import pytest

from gpulse.sources.processes import NOTHING, ContainerNamer, ProcessDescriber, container_id_from_cgroup

CID = "3f4e" * 16
OTHER = "9a8b" * 16


def make_proc(
    root: Path,
    pid: int,
    *,
    start: int = 1000,
    cmdline: bytes = b"python\0train.py\0",
    comm: str = "python",
    uid: int = 0,
    cgroup: str = "0::/user.slice\n",
) -> Path:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # comm may hold spaces and parentheses; starttime is field 22
    (d / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n")
    (d / "cmdline").write_bytes(cmdline)
    (d / "comm").write_text(comm + "\n")
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "cgroup").write_text(cgroup)
    return d


class FakeContainers:
    def __init__(self, names: dict[str, str], fail: Exception | None = None) -> None:
        self.names = names
        self.fail = fail
        self.calls = 0

    def get(self, container_id: str):
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        if container_id not in self.names:
            raise docker.errors.NotFound(f"No such container: {container_id}")
        return type("Container", (), {"name": self.names[container_id]})()


class FakeDockerClient:
    def __init__(self, names: dict[str, str], fail: Exception | None = None) -> None:
        self.containers = FakeContainers(names, fail)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    "cgroup",
    [
        f"12:memory:/docker/{CID}\n11:cpu,cpuacct:/docker/{CID}\n",  # cgroup v1
        f"0::/system.slice/docker-{CID}.scope\n",  # v2, systemd driver
        f"0::/docker/{CID}\n",  # v2, cgroupfs driver
        f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{CID}.scope\n",  # rootless
        f"0::/kubepods.slice/kubepods-burstable.slice/docker-{CID}.scope/init\n",
    ],
)
def test_docker_container_ids_are_found_in_every_cgroup_layout(cgroup):
    assert container_id_from_cgroup(cgroup) == CID


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        f"0::/system.slice/containerd-{CID}.scope\n",
        "0::/docker/abc\n",
    ],
)
def test_processes_outside_docker_have_no_container(cgroup):
    assert container_id_from_cgroup(cgroup) is None


def test_command_user_and_container_name_are_read(tmp_path):
    make_proc(
        tmp_path,
        4100,
        cmdline=b"python\0-m\0torch.distributed.run\0--nproc_per_node=8\0",
        uid=0,
        cgroup=f"0::/system.slice/docker-{CID}.scope\n",
    )
    namer = ContainerNamer(client_factory=lambda: FakeDockerClient({CID: "llm-train"}))
    d = ProcessDescriber(proc_root=str(tmp_path), namer=namer).describe(4100)
    assert d.command == "python -m torch.distributed.run --nproc_per_node=8"
    assert d.user == "root"
    assert d.container == "llm-train"


def test_a_uid_without_a_passwd_entry_is_reported_as_its_number(tmp_path):
    make_proc(tmp_path, 4100, uid=4_000_123)
    d = ProcessDescriber(proc_root=str(tmp_path), namer=ContainerNamer(client_factory=lambda: None)).describe(4100)
    assert d.user == "4000123" and d.container is None


def test_a_kernel_thread_or_zombie_falls_back_to_comm_and_long_commands_are_cut(tmp_path):
    make_proc(tmp_path, 10, cmdline=b"", comm="weird (name) x")
    make_proc(tmp_path, 11, cmdline=b"x" * 5000)
    describer = ProcessDescriber(
        proc_root=str(tmp_path), namer=ContainerNamer(client_factory=lambda: None), max_command=64
    )
    assert describer.describe(10).command == "[weird (name) x]"
    assert describer.describe(11).command == "x" * 64


def test_a_vanished_process_gives_nothing_and_does_not_raise(tmp_path):
    describer = ProcessDescriber(proc_root=str(tmp_path), namer=ContainerNamer(client_factory=lambda: None))
    assert describer.describe(999_999) is NOTHING


def test_details_are_cached_by_pid_and_start_time_so_a_reused_pid_is_read_again(tmp_path):
    make_proc(tmp_path, 4100, start=1000, cmdline=b"old\0")
    describer = ProcessDescriber(proc_root=str(tmp_path), namer=ContainerNamer(client_factory=lambda: None))
    assert describer.describe(4100).command == "old"
    (tmp_path / "4100" / "cmdline").write_bytes(b"changed\0")
    assert describer.describe(4100).command == "old"  # same process: cached
    make_proc(tmp_path, 4100, start=2000, cmdline=b"new\0")
    assert describer.describe(4100).command == "new"  # PID reused by a new process


def test_container_names_are_cached(tmp_path):
    client = FakeDockerClient({CID: "a"})
    namer = ContainerNamer(client_factory=lambda: client)
    assert [namer.name(CID) for _ in range(3)] == ["a", "a", "a"]
    assert client.containers.calls == 1


def test_without_a_reachable_engine_the_short_id_is_used_and_retried_later(tmp_path):
    clock = Clock()
    attempts = []

    def factory():
        attempts.append(clock.t)
        raise docker.errors.DockerException("Error while fetching server API version: connection refused")

    namer = ContainerNamer(client_factory=factory, retry_s=60, clock=clock)
    assert namer.name(CID) == CID[:12]
    assert namer.name(OTHER) == OTHER[:12]
    assert attempts == [100.0]  # one failed connection per retry period, not one per container
    clock.t += 61
    assert namer.name(CID) == CID[:12]
    assert attempts == [100.0, 161.0]


def test_no_socket_means_no_client_and_no_error(tmp_path):
    namer = ContainerNamer(socket_path=str(tmp_path / "missing.sock"))
    assert namer.name(CID) == CID[:12]


def test_an_unknown_container_keeps_its_id_and_a_failing_engine_reconnects_later(tmp_path):
    clock = Clock()
    first, second = FakeDockerClient({}), FakeDockerClient({OTHER: "b"})
    clients = [first, second]
    namer = ContainerNamer(client_factory=lambda: clients.pop(0), retry_s=60, clock=clock)
    assert namer.name(CID) == CID[:12]  # NotFound: that container is gone, the engine is fine
    first.containers.fail = docker.errors.APIError("500 Server Error")
    assert namer.name(OTHER) == OTHER[:12]  # the engine itself failed: drop the client
    assert first.containers.calls == 2
    clock.t += 61  # both the client and the cached fallback names expire
    assert namer.name(OTHER) == "b"
    assert namer.name(CID) == CID[:12]
    assert namer.failures == 3
