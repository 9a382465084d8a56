"""The host sampler (``gpulse.sources.host``) on real processes, each figure against what the kernel
itself says (``/proc/PID/stat``, the cgroup's own files) or what the test made happen."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.cgroup_limits import READ_SIZE, CpuLimit, SlowDisk
from support.waiting import wait_until

from gpulse.schema import HOST, HOST_PROCESS
from gpulse.sources import host
from gpulse.sources.host import HostSampler, TrainingProcess, cgroup_cpu_limit

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, read straight from the kernel (proc(5), fields 14 and 15)."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def start(code: str, prefix: list[str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([*(prefix or []), sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


@pytest.fixture
def procs():
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def test_a_process_s_first_sample_has_no_cpu_share_and_the_next_one_is_the_kernel_s(procs) -> None:
    p = start("while True: pass")
    procs.append(p)
    sampler = HostSampler()
    target = [TrainingProcess("r1", "0", p.pid)]
    (first,) = sampler.processes(target)
    assert first.process == "main" and first.pid == p.pid
    assert first.cpu_pct is None  # psutil's first cpu_percent() measures nothing: not written
    t0, c0 = time.monotonic(), cpu_seconds(p.pid)
    time.sleep(1.0)
    (second,) = sampler.processes(target)
    truth = 100 * (cpu_seconds(p.pid) - c0) / (time.monotonic() - t0)
    assert second.cpu_pct is not None and abs(second.cpu_pct - truth) < 15, (second.cpu_pct, truth)
    assert second.fields()["running"] in (0, 1) and second.mem_rss_bytes and second.threads == 1
    assert set(second.fields()) <= set(HOST_PROCESS.by_name)


def test_workers_are_the_children_numbered_in_order_and_multiprocessing_helpers_are_not(procs) -> None:
    code = (
        "import os, sys, time\n"
        "from multiprocessing import resource_tracker\n"
        "resource_tracker.ensure_running()\n"
        "pids = []\n"
        "for _ in range(2):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(60); os._exit(0)\n"
        "    pids.append(pid)\n"
        "print(*pids, flush=True)\n"
        "time.sleep(60)\n"
    )
    p = start(code)
    procs.append(p)
    workers = [int(x) for x in p.stdout.readline().split()]
    assert len(psutil.Process(p.pid).children()) == 3  # the two workers and the resource tracker
    readings = HostSampler().processes([TrainingProcess("r1", "2", p.pid)])
    by_name = {r.process: r for r in readings}
    assert sorted(by_name) == ["main", "worker0", "worker1"]
    assert [by_name["worker0"].pid, by_name["worker1"].pid] == workers
    assert by_name["main"].workers == 2
    assert {r.tags["run"] for r in readings} == {"r1"} and {r.tags["rank"] for r in readings} == {"2"}


def test_a_process_that_ends_is_one_gone_reading_then_nothing(procs) -> None:
    p = start("import time; time.sleep(60)")
    procs.append(p)
    sampler = HostSampler()
    target = [TrainingProcess("r1", "0", p.pid)]
    assert sampler.processes(target)[0].state != "gone"
    p.kill()
    p.wait()
    (gone,) = sampler.processes(target)
    assert gone.state == "gone" and gone.fields() == {"pid": p.pid, "state": "gone", "running": 0, "disk_sleep": 0}
    assert sampler.processes(target) == []


def test_a_reader_of_a_throttled_disk_is_seen_in_state_d_reading_at_the_throttle_s_rate(tmp_path, procs) -> None:
    rate = 256 * 1024
    disk = SlowDisk(tmp_path, read_bytes_per_s=rate)
    try:
        code = (
            "import sys\n"
            "from support.cgroup_limits import read_block\n"
            "i = 0\n"
            f"while True:\n    read_block({disk.device!r}, (i * {READ_SIZE}) % {disk.size}); i += 1\n"
        )
        reader = subprocess.Popen(
            [*disk.prefix(), sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": _tests_path()}
        )
        try:
            sampler = HostSampler()
            target = [TrainingProcess("r1", "0", reader.pid)]
            wait_until(lambda: sampler.processes(target) != [], what="the reader")
            readings = []
            for _ in range(10):
                time.sleep(0.2)
                readings += sampler.processes(target)
        finally:
            reader.kill()
            reader.wait()
    finally:
        disk.close()
    in_d = sum(r.fields()["disk_sleep"] for r in readings) / len(readings)
    assert in_d >= 0.6, [r.state for r in readings]  # a throttled reader waits in the block layer
    rates = [r.read_bytes_per_s for r in readings if r.read_bytes_per_s is not None]
    mean = sum(rates) / len(rates)
    assert 0.5 * rate <= mean <= 1.5 * rate, (mean, rate)


def _tests_path() -> str:
    return os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])


def test_the_node_s_first_sample_has_no_shares_and_later_ones_add_up_to_all_cpu_time() -> None:
    sampler = HostSampler()
    first = sampler.node()
    assert first.cpu_busy_pct is None and first.disk_read_bytes_per_s is None
    assert first.cpus == psutil.cpu_count() and 0 < first.mem_available_bytes <= first.mem_total_bytes
    time.sleep(0.5)
    n = sampler.node()
    parts = [n.cpu_busy_pct, n.cpu_idle_pct, n.cpu_iowait_pct, n.cpu_steal_pct]
    assert all(p is not None and 0 <= p <= 100 for p in parts), parts
    assert abs(sum(p for p in parts if p is not None) - 100) < 0.5
    assert set(n.fields()) == set(HOST.by_name)  # every field, once rates exist (this machine has a disk)


def test_the_cpu_limit_of_a_process_s_cgroup_is_read_and_none_without_one(procs) -> None:
    limit = CpuLimit(0.5)
    try:
        p = start("import time; time.sleep(60)", prefix=limit.prefix())
        procs.append(p)
        wait_until(lambda: cgroup_cpu_limit(p.pid) is not None, what="the process in its cgroup")
        assert cgroup_cpu_limit(p.pid) == 0.5
        (main,) = HostSampler().processes([TrainingProcess("r1", "0", p.pid)])
        assert main.cpu_limit_cores == 0.5
        p.kill()
        p.wait()
    finally:
        limit.close()
    assert cgroup_cpu_limit(os.getpid()) is None


def test_two_ranks_in_one_process_each_get_their_cpu_share(procs) -> None:
    """Each (run, rank) keeps its own counters: sharing them, each sample would prime the other's."""
    p = start("while True: pass")
    procs.append(p)
    sampler = HostSampler()
    targets = [TrainingProcess("r1", "0", p.pid), TrainingProcess("r1", "1", p.pid)]
    assert [r.cpu_pct for r in sampler.processes(targets)] == [None, None]
    time.sleep(0.5)
    second = sampler.processes(targets)
    assert [r.rank for r in second] == ["0", "1"] and all(r.cpu_pct is not None and r.cpu_pct > 10 for r in second)


def test_a_worker_that_ended_unreaped_is_one_gone_reading_then_nothing(procs) -> None:
    code = (
        "import os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.stdin.readline(); os._exit(0)\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"  # never reaps its child: it stays a zombie
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    procs.append(p)
    worker = int(p.stdout.readline())
    sampler = HostSampler()
    target = [TrainingProcess("r1", "0", p.pid)]
    assert [r.process for r in sampler.processes(target)] == ["main", "worker0"]
    p.stdin.write("\n")
    p.stdin.flush()
    wait_until(lambda: psutil.Process(worker).status() == psutil.STATUS_ZOMBIE, what="the worker's end")
    assert [(r.process, r.state) for r in sampler.processes(target)][1] == ("worker0", "gone")
    assert [r.process for r in sampler.processes(target)] == ["main"]


def test_processes_beyond_max_processes_wait_for_a_place_counted_and_logged_once(procs, monkeypatch, caplog) -> None:
    """Those followed keep their place (their rates need the last cycle); a further one is skipped until one
    is no longer followed."""
    monkeypatch.setattr(host, "MAX_PROCESSES", 2)
    for _ in range(3):
        procs.append(start("import time; time.sleep(60)"))
    sampler = HostSampler()
    target = [TrainingProcess(f"r{k}", "0", p.pid) for k, p in enumerate(procs)]
    for cycle in (1, 2):
        assert [r.run for r in sampler.processes(target)] == ["r0", "r1"]
        assert sampler.processes_skipped == cycle
    assert len([r for r in caplog.records if "is not sampled" in r.getMessage()]) == 1
    # r0's process ended and the channel unregistered it: its place is free from the next cycle on
    assert [r.run for r in sampler.processes(target[1:])] == ["r1"] and sampler.processes_skipped == 3
    assert [r.run for r in sampler.processes(target[1:])] == ["r1", "r2"] and sampler.processes_skipped == 3
