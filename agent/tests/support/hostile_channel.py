"""Hostile channel traffic: unique run names, field names and tag sets, one round at a time.

One definition for the memory test (``agent/tests/channel/test_channel_server_memory.py``) and the
driver that names what the agent keeps under it (``bench/memory_holders.py``), so that both measure
the same input.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

from gpulse.cli.commands.status import query_status
from support.waiting import wait_until

#: The tags of every attack point; ``run`` (and ``user``) change.
TAGS = {"run": "attack", "rank": "0", "local_rank": "0", "world_size": "1"}
#: Datagrams sent before the sender waits for the agent to have read them.
PACE = 50


def attack(round_: int) -> Iterator[tuple[bytes, int]]:
    """One round as datagrams (with the messages each holds): 200,000 unique field names, then 20,000 unique tag sets."""
    now = time.time_ns()

    def point(seq: int, tags: dict, fields: dict) -> dict:
        return {"v": 1, "kind": "point", "seq": seq, "m": "train_step", "ts": now, "tags": tags, "fields": fields}

    for n in range(0, 200_000, 200):  # 200 new names per point; the first half from one run
        run = f"one-{round_}" if n < 100_000 else f"spread-{round_}-{n // 1000}"
        fields = {"step": n, **{f"log_r{round_}_{i}": 1.0 for i in range(n, n + 200)}}
        yield json.dumps(point(n, {**TAGS, "run": run}, fields)).encode(), 1
    for k in range(0, 20_000, 100):  # 100 points per datagram, each its own run and tag set
        batch = [point(k + i, {**TAGS, "run": f"set-{round_}-{k + i}", "user": f"u{k + i}"}, {"step": 1}) for i in range(100)]  # fmt: skip
        yield json.dumps({"v": 1, "batch": batch}).encode(), len(batch)


def send_round(sock: socket.socket, path: str, round_: int, received_before: int, wait: float = 2.0) -> int:
    """Send one round to the agent on ``path``, paced so that what it keeps is measured, not a
    backlog; returns the messages sent once the agent has received them all (``wait``: for each
    status answer, longer for an agent slowed by tracing)."""

    def received() -> int:
        return int(query_status(path, wait)["records_received"])

    sent = 0
    for i, (data, messages) in enumerate(attack(round_)):
        sock.sendto(data, path)
        sent += messages
        if i % PACE == PACE - 1:
            wait_until(lambda n=received_before + sent: received() >= n, 60, "the agent")
    expected = received_before + sent
    wait_until(lambda: received() >= expected, 60, f"round {round_} received")
    return sent


def flushed(path: str, wait: float = 2.0) -> bool:
    """Nothing waits in the agent's buffer, and nothing more was written since the last look: the
    lines in flight are not counted as memory the attack kept."""
    before = query_status(path, wait)
    time.sleep(0.3)
    after = query_status(path, wait)
    return after["buffer_lines"] == 0 and after["lines_written"] == before["lines_written"]
