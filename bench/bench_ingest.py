"""4. Ingest: training records per second the agent accepts from its socket on one core, with
several sending processes.

The real ``gpulse agent`` runs pinned to CPU 0 (recording to a file, so no database limits it);
sender processes pinned to the other core send ``train_step`` points packed into datagrams
exactly as the training client packs them (``protocol.StepRows``, durations in integer ns,
``encode_rows``, ``rows_per_datagram`` rows under ``MAX_DATAGRAM``), with blocking sends, so the kernel's backpressure paces them and nothing is
lost. The figure is records counted by the agent (``records_received`` via ``gpulse status``)
divided by the time from the first send until the agent has counted them all.

The baseline (``ingest_ratio_vs_bare_recv``) is a bare loop, pinned to the same core, that receives
the same datagrams from the same senders and decodes them with the standard library only: the
header with ``json``, the rows with ``struct`` (their layout from the header's ``kinds``, as
:func:`gpulse.channel.protocol.row_struct` defines it), counting every record; no validation,
encoding or delivery. The two alternate, several rounds each (one agent started once and kept
running, idle at 1 Hz between its rounds), and the ratio is of the medians. Its goal was set from
the figures measured once the ratio existed (BENCHMARKS.md): a floor a little under the lowest of
them, so that a change that slows the ingest shows, and not the machine's hour.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import Table, scale

from gpulse.channel import protocol
from gpulse.cli.commands.status import query_status

SENDERS = 3


def _datagrams(sender: int, n: int) -> list[bytes]:
    tags = {"run": "bench", "rank": str(sender), "local_rank": str(sender), "world_size": str(SENDERS)}
    head = protocol.PointHead("train_step", tags)
    shape = protocol.FieldShape(
        ("step", "step_time_s", "data_wait_s", "forward_s", "backward_s", "optimizer_s", "samples", "tokens",
         "samples_per_s", "tokens_per_s", "log_loss"),
        "i" + "nnnnn" + "ii" + "fff",
    )  # fmt: skip
    t0 = time.time_ns()
    values = (100_000_000, 10_000_000, 30_000_000, 50_000_000, 10_000_000, 32, 65536, 320.0, 655360.0, 1.5)
    rows = protocol.StepRows(head, shape, [(i, *values, t0 + i * 1000) for i in range(n)])
    per = protocol.rows_per_datagram(head, shape)
    return [protocol.encode_rows(rows[i : i + per], i) for i in range(0, n, per)]


def _sender(path: str, sender: int, n: int, ready: mp.Barrier) -> None:  # type: ignore[type-arg]
    os.sched_setaffinity(0, {1})
    data = _datagrams(sender, n)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(protocol.client_address())
    ready.wait()
    for d in data:
        s.sendto(d, path)
    s.close()


def _run_senders(path: str, per_sender: int) -> tuple[float, list[mp.Process]]:
    """Start the senders; return the monotonic time of the first send (all start together) and them."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(SENDERS + 1)
    procs = [ctx.Process(target=_sender, args=(path, i, per_sender, barrier)) for i in range(SENDERS)]
    for p in procs:
        p.start()
    barrier.wait()
    return time.monotonic(), procs


def _bare_decode(r: socket.socket, datagrams: int) -> int:
    """Receive ``datagrams`` rows datagrams and decode every record in them; the number of records."""
    layouts: dict[str, Any] = {}
    records = 0
    for _ in range(datagrams):
        data = r.recv(1 << 17)
        end = data.index(b"\n")
        kinds = json.loads(data[1:end])["kinds"]
        row = layouts.get(kinds) or layouts.setdefault(kinds, protocol.row_struct(kinds))
        for _values in row.iter_unpack(data[end + 1 :]):
            records += 1
    return records


def _bare_rate(tmp: Path, per_sender: int) -> float:
    """Records/s of the bare receive-and-decode loop on CPU 0, fed like the agent."""
    path = str(tmp / "bare.sock")
    r = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    r.bind(path)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    total = SENDERS * per_sender
    expected = sum(len(_datagrams(i, per_sender)) for i in range(SENDERS))
    pid = os.fork()
    if pid == 0:  # the reader, pinned to CPU 0 like the agent
        os.sched_setaffinity(0, {0})
        os._exit(0 if _bare_decode(r, expected) == total else 1)
    t0, procs = _run_senders(path, per_sender)
    _, status = os.waitpid(pid, 0)
    dt = time.monotonic() - t0
    for p in procs:
        p.join()
    r.close()
    os.unlink(path)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("the bare loop did not decode every record it was sent")
    return total / dt


@contextmanager
def _agent(tmp: Path) -> Iterator[str]:
    """The real agent on CPU 0, recording to a file; yields its socket."""
    sock = str(tmp / "run" / "agent.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    agent = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-m", "gpulse", "agent", "--simulate", "1", "--interval", "1",
         "--record", str(tmp / "agent.lp"), "--socket", sock, "--spool-dir", str(tmp / "spool")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        yield sock
    finally:
        agent.terminate()
        agent.wait(timeout=60)


def _counted(sock: str) -> tuple[int, int]:
    status = query_status(sock, timeout=5)
    return int(status.get("records_received") or 0), int(status.get("records_rejected") or 0)


def _agent_rate(sock: str, per_sender: int) -> tuple[float, int]:
    """Records/s the agent counts in one round of the senders, and how many it rejected."""
    total = SENDERS * per_sender
    before, rejected_before = _counted(sock)
    t0, procs = _run_senders(sock, per_sender)
    received = 0
    while time.monotonic() - t0 < 300:
        received = _counted(sock)[0] - before
        if received >= total:
            break
        time.sleep(0.05)
    dt = time.monotonic() - t0
    for p in procs:
        p.join()
    if received < total:
        raise RuntimeError(f"the agent counted {received} of {total} records")
    return received / dt, _counted(sock)[1] - rejected_before


#: ``ingest_ratio_vs_bare_recv`` at least (see the module's docstring).
INGEST_RATIO_GOAL = 0.01


def run(table: Table) -> dict[str, float]:
    per_sender = scale(60_000, 6_000)
    ours: list[float] = []
    bare: list[float] = []
    rejected = 0
    with tempfile.TemporaryDirectory() as tmp, _agent(Path(tmp)) as sock:
        for _ in range(scale(5, 2)):  # alternately: the agent, then the bare loop
            rate, lost = _agent_rate(sock, per_sender)
            ours.append(rate)
            rejected += lost
            bare.append(_bare_rate(Path(tmp), per_sender))
    agent_rate, bare_rate = statistics.median(ours), statistics.median(bare)
    table.add(
        f"ingest, training records/s on one core ({SENDERS} senders, {SENDERS * per_sender:,} records a round, "
        f"median of {len(ours)} rounds, {rejected} rejected)",
        f"{agent_rate:,.0f} ({min(ours):,.0f}-{max(ours):,.0f})",
        f"{bare_rate:,.0f} ({min(bare):,.0f}-{max(bare):,.0f}): recv + json header + struct rows, nothing else",
        f"{agent_rate / bare_rate:.3f}",
        f">= {INGEST_RATIO_GOAL}",
    )
    return {"ingest_records_per_s": round(agent_rate), "ingest_ratio_vs_bare_recv": round(agent_rate / bare_rate, 3)}


if __name__ == "__main__":
    table = Table()
    print(json.dumps(run(table)))
    print(table.render())
