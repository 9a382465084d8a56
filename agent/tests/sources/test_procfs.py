"""The node's counters read straight from /proc (``gpulse.sources.procfs``) say what psutil says.

psutil is the reference: each figure of :func:`read_node` lies between psutil's reading of it just
before and just after (counters only grow), or equals it where it cannot move (total memory, which
devices there are). The fallback through psutil is held to the same brackets, and a counter that
wraps grows by what psutil's ``nowrap=True`` makes of it."""

from __future__ import annotations

import itertools
import os

import psutil
import pytest
from psutil._common import _WrapNumbers

from gpulse.sources.procfs import NodeCounters, _from_proc, _from_psutil, counter_delta, read_node

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_ticks(t: psutil._common.pcputimes) -> dict[str, float]:  # type: ignore[name-defined]
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return {"total": total * TICK, "idle": t.idle * TICK, "iowait": t.iowait * TICK, "steal": t.steal * TICK}


def _between(lo: float, value: float, hi: float, slack: float = 0.0) -> bool:
    return lo - slack <= value <= hi + slack


@pytest.mark.parametrize("reader", [_from_proc, _from_psutil], ids=["proc", "psutil fallback"])
def test_every_counter_lies_between_psutil_s_readings_before_and_after(reader) -> None:
    cpu0, swap0 = psutil.cpu_times(), psutil.swap_memory()
    disks0, nics0 = psutil.disk_io_counters(perdisk=True), psutil.net_io_counters(pernic=True)
    n: NodeCounters = reader(123.0)
    cpu1, swap1 = psutil.cpu_times(), psutil.swap_memory()
    disks1, nics1 = psutil.disk_io_counters(perdisk=True), psutil.net_io_counters(pernic=True)

    assert n.at == 123.0
    assert n.mem_total_bytes == psutil.virtual_memory().total
    assert 0 < n.mem_available_bytes <= n.mem_total_bytes
    assert 0 <= n.swap_used_bytes <= swap1.total
    assert _between(swap0.sin, n.swap_in_bytes, swap1.sin) and _between(swap0.sout, n.swap_out_bytes, swap1.sout)
    before, after = _cpu_ticks(cpu0), _cpu_ticks(cpu1)
    for mode in ("total", "idle", "iowait", "steal"):  # psutil's seconds are ticks / SC_CLK_TCK, rounded
        assert _between(before[mode], getattr(n.cpu, mode), after[mode], slack=1), (mode, before, n.cpu, after)
    assert set(n.disks) == set(disks1) and n.disks, "this machine has block devices"
    for name, d in n.disks.items():
        a, b = disks0[name], disks1[name]
        assert _between(a.read_bytes, d.read_bytes, b.read_bytes), name
        assert _between(a.write_bytes, d.write_bytes, b.write_bytes), name
        assert _between(a.busy_time, d.busy_ms, b.busy_time), name
    assert set(n.nics) == set(nics1) and "lo" in n.nics
    for name, nic in n.nics.items():
        assert _between(nics0[name].bytes_recv, nic.bytes_recv, nics1[name].bytes_recv), name
        assert _between(nics0[name].bytes_sent, nic.bytes_sent, nics1[name].bytes_sent), name


def test_read_node_reads_proc_on_linux_and_stamps_the_sampler_s_clock() -> None:
    n = read_node(7.5)
    assert n.at == 7.5
    assert n.disks.keys() == _from_proc(0.0).disks.keys()


def test_a_counter_that_wraps_grows_as_psutil_nowrap_makes_it_grow() -> None:
    raw = [100, 4_000_000_000, 4_294_967_000, 500, 900, 10, 20]  # a 32-bit counter wrapping twice
    psutil_view = _WrapNumbers()
    adjusted = [psutil_view.run({"sda": (v,)}, "disk")["sda"][0] for v in raw]
    ours = [counter_delta(a, b) for a, b in itertools.pairwise(raw)]
    theirs = [b - a for a, b in itertools.pairwise(adjusted)]
    assert ours == theirs
    assert all(d >= 0 for d in ours)
