"""Hostile or careless input cannot grow a live agent's memory: unique field names and unique tag sets.

A real ``gpulse agent`` (simulated GPUs, recording to a file) receives, through its socket, 200,000
unique ``log_*`` names (half from one run, half spread over 100 runs) and 20,000 unique tag sets,
five times. What it may remember is bounded (``docs/channel.md``, "Limits"): its RSS stays within the
documented bound of where it started after every round, and once the caches are full (the first
three rounds) it grows no further: the later rounds do not all end above the first rounds' peak (a
leak would lift every later round; the allocator lifts one now and then). One run's
excess is named once in its log and counted, and the agent keeps answering ``gpulse status``.

Why not "the second round adds less than 5 MiB": the allocator moves the RSS by up to ~8 MiB from one
round to the next without anything being kept (measured over six rounds: 41.1, 37.8, 43.6, 44.1,
44.2, 44.2 MiB; 40.4, 45.3, 41.7, 44.8, 44.8, 42.6 MiB; one round jumped from 42.1 to 49.6 MiB), so
that check failed in about one run in four, CI included.
"""

from __future__ import annotations

import socket
from pathlib import Path

from agentproc import AgentProc
from support.hostile_channel import flushed, send_round
from support.waiting import wait_until

from gpulse.channel.protocol import MAX_OPEN_FIELDS_PER_RUN
from gpulse.cli.commands.status import query_status

#: docs/channel.md, "Limits": what the agent's RSS may grow by under any such input.
RSS_BOUND_MIB = 25
#: Rounds of the attack: the first ones fill the caches, the last ones show that nothing more is kept.
ROUNDS = 5
FILLING = 3
#: Once the caches are full the later rounds' lowest RSS stays within this of the filling rounds' peak.
FLAT_MIB = 5


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_unique_names_and_tag_sets_leave_the_agents_memory_flat(clean_env: dict[str, str], tmp_path: Path) -> None:
    path = str(tmp_path / "run" / "agent.sock")
    args = ["--simulate", "1", "--interval", "1", "--flush-interval", "0.2", "--record", str(tmp_path / "rec.lp")]
    agent = AgentProc([*args, "--socket", path, "--spool-dir", str(tmp_path / "spool")], clean_env, tmp_path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        wait_until(lambda: Path(path).exists(), what="the agent's socket")
        wait_until(lambda: query_status(path)["samples"] >= 2, what="two sampling cycles")
        base = query_status(path)["records_received"]
        rss = [rss_mib(agent.pid)]
        sent = 0
        for round_ in range(1, ROUNDS + 1):
            sent += send_round(sock, path, round_, base + sent)
            wait_until(lambda: flushed(path), 60, f"round {round_} written to the record file")
            rss.append(rss_mib(agent.pid))
        status = query_status(path)
        assert status["gpus"] and status["records_received"] >= base + sent
        dropped = status["training_channel"]["values_dropped_by_cause"]
    finally:
        sock.close()
        assert agent.stop() == 0
    print(f"RSS MiB by round: {[round(r, 1) for r in rss]}")
    assert max(rss[1:]) - rss[0] < RSS_BOUND_MIB, rss
    assert min(rss[FILLING + 1 :]) - max(rss[1 : FILLING + 1]) < FLAT_MIB, rss
    # one run's excess is counted (the spread runs stay within their budget) and named once per run
    assert dropped == {"too_many_open_fields": ROUNDS * (100_000 - MAX_OPEN_FIELDS_PER_RUN)}
    named = [line for line in agent.stderr.splitlines() if "distinct log_*/phase_* fields" in line]
    assert len(named) == ROUNDS and all(f"run one-{r} " in line for r, line in enumerate(named, 1))
    # more runs stepped than the rolling findings judge at once: the oldest made room, counted
    assert agent.summary()["live_runs_evicted"] > 0
