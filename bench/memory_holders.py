"""What the agent keeps under hostile channel traffic, and where: tracemalloc snapshots diffed by line.

Not a ratio benchmark (``make bench`` does not run it): a driver that names the holders behind the
RSS bound of ``agent/tests/channel/test_channel_server_memory.py``. The real agent (``Agent``,
simulated GPU, recording to a file) runs in this process under :mod:`tracemalloc`; the test's own
traffic (``support.hostile_channel``) goes through its socket, round after round. After each round
it prints:

* the growth since the start grouped by the innermost line of ``gpulse`` that allocated it (a
  decoded JSON string is charged to the decoder's caller, the line that keeps it);
* the deep size of each per-run structure the agent holds (objects shared between them are charged
  to the first listed), with its entry count, so a size per run, rank or process follows.

``--ranks N`` then registers N ranks (each its own run, eight GPU UUIDs, a start point naming this
process as the training process, and a step), which fills the per-rank and per-process holders
(registrations, rank jobs, host processes) that the test's traffic leaves empty.

    PYTHONPATH=agent/src .venv/bin/python bench/memory_holders.py --rounds 3 --ranks 300
"""

from __future__ import annotations

import argparse
import gc
import json
import socket
import sys
import tempfile
import threading
import time
import tracemalloc
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts agent/tests on the path)
from support.hostile_channel import TAGS, flushed, send_round
from support.waiting import wait_until

from gpulse import schema
from gpulse.agent.config import load_config
from gpulse.agent.loop import Agent
from gpulse.cli.commands import agent as agent_cmd
from gpulse.cli.commands.status import query_status

_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.FrameType)


def deep_size(root: Any, seen: set[int]) -> int:
    """Bytes of ``root`` and everything it reaches that ``seen`` does not hold yet (modules, types,
    functions and the schema are never counted)."""
    total, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def holders(agent: Agent) -> dict[str, tuple[Any, int]]:
    """Name -> (structure, entries): what the agent keeps per run, rank or process."""
    r, v, h = agent.receiver, agent.receiver._validator, agent.host_sampler
    return {
        "live findings windows (agent/findings.py)": (agent.findings._runs, len(agent.findings._runs)),
        "validator runs (channel/validate.py)": (v._runs, len(v._runs)),
        "validator rank jobs (channel/validate.py)": (v._rank_jobs, len(v._rank_jobs)),
        "registrations (channel/server.py)": (r._registrations, len(r._registrations)),
        "started processes (channel/server.py)": (r._started, len(r._started)),
        "GPU jobs (channel/server.py)": (r._gpu_jobs, len(r._gpu_jobs)),
        "clients' ack state (channel/server.py)": (r._clients, len(r._clients)),
        "host processes (sources/host.py)": (h._tracked if h else {}, len(h._tracked) if h else 0),
        "host_process series (agent/loop.py)": (agent._process_series, len(agent._process_series)),
        "agent encoder's series (lineprotocol/encode.py)": (agent.encoder._series, len(agent.encoder._series)),
    }


def print_holders(agent: Agent) -> None:
    seen: set[int] = set()
    deep_size(schema.MEASUREMENTS, seen)  # shared by every series: not a holder's
    for name, (obj, n) in holders(agent).items():
        size = deep_size(obj, seen)
        per = f"{size / n / 1024:8.1f} KiB each" if n else ""
        print(f"  {size / 2**20:8.2f} MiB  {n:6d} entries {per}  {name}")


def charged_line(tb: tracemalloc.Traceback) -> str:
    """The innermost frame in gpulse (else the innermost frame): the code that asked for the memory."""
    for frame in reversed(tb):  # oldest first: reversed is innermost first
        if "/gpulse/" in frame.filename:
            return f"{frame.filename.split('/gpulse/', 1)[1]}:{frame.lineno}"
    return f"{tb[-1].filename}:{tb[-1].lineno}"


def print_growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, top: int) -> None:
    by_line: dict[str, int] = {}
    for stat in after.compare_to(before, "traceback"):
        key = charged_line(stat.traceback)
        by_line[key] = by_line.get(key, 0) + stat.size_diff
    total = sum(by_line.values())
    print(f"  traced growth since the start: {total / 2**20:.2f} MiB; top lines:")
    for key, size in sorted(by_line.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {size / 2**20:8.2f} MiB  {key}")


def snapshot() -> tracemalloc.Snapshot:
    gc.collect()
    return tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])


def ranks(n: int) -> Iterable[bytes]:
    """N ranks, each its own run: a registration (eight GPUs), a start point naming this process, a step."""
    import os

    now, pid = time.time_ns(), os.getpid()
    for k in range(n):
        run = f"rank-run-{k}"
        uuids = [f"GPU-{k:08d}-0000-0000-0000-{g:012d}" for g in range(8)]
        yield json.dumps({"v": 1, "kind": "register", "seq": 3 * k, "run": run, "rank": "0", "pid": pid, "uuids": uuids}).encode()  # fmt: skip
        tags = {**TAGS, "run": run}
        start = {"event": "start", "pid": pid}
        for seq, m, fields in ((3 * k + 1, "train_run", start), (3 * k + 2, "train_step", {"step": 1})):
            yield json.dumps({"v": 1, "kind": "point", "seq": seq, "m": m, "ts": now, "tags": tags, "fields": fields}).encode()  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=0, help="then register this many ranks (see the module's docstring)")
    p.add_argument("--top", type=int, default=12)
    opts = p.parse_args()
    tracemalloc.start(10)
    tmp = Path(tempfile.mkdtemp(prefix="gpulse-holders-"))
    path = str(tmp / "run" / "agent.sock")
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    args = parser.parse_args(
        ["--simulate", "1", "--interval", "1", "--flush-interval", "0.2", "--record", str(tmp / "rec.lp")]
        + ["--socket", path, "--spool-dir", str(tmp / "spool")]
    )
    agent = Agent(load_config(args), stream=open("/dev/null", "w"), tty=False)
    thread = threading.Thread(target=agent.run, name="agent")
    thread.start()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        wait_until(lambda: Path(path).exists() and query_status(path, 30)["samples"] >= 2, what="the agent")
        base = snapshot()
        received = query_status(path, 30)["records_received"]
        for round_ in range(1, opts.rounds + 1):
            received += send_round(sock, path, round_, received, wait=30)
            wait_until(lambda: flushed(path, 30), 120, f"round {round_} written")
            print(f"after round {round_}:")
            print_growth(base, snapshot(), opts.top)
            print_holders(agent)
        if opts.ranks:
            for data in ranks(opts.ranks):
                sock.sendto(data, path)
                time.sleep(0.0005)  # the socket's queue is the agent's to drain
            time.sleep(3)  # two sampling cycles: the host sampler reads the new processes
            print(f"after {opts.ranks} ranks:")
            print_growth(base, snapshot(), opts.top)
            print_holders(agent)
    finally:
        sock.close()
        agent.request_stop("done")
        thread.join(60)


if __name__ == "__main__":
    main()
