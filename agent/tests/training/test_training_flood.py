"""A flood of steps: the agent keeps receiving during it, and every step is accounted for afterwards.

The loop does nothing but ``with run.step()``, far faster than the background worker can turn steps
into points, against a real ``gpulse agent`` process (recording to a file). The worker drains in
slices and talks to the agent between them, so points reach the agent while the flood lasts; the
queue is bounded (``max_queue``), and what it could not take is counted and said at ``finish()``.
Every step is then in exactly one of: the agent's file, the client's fallback file, the count of
steps not kept.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from agentproc import AgentProc
from support.waiting import wait_until
from training_support import recorded

from gpulse.channel.protocol import RECORD_FILE
from gpulse.cli.commands.status import AgentUnreachable, query_status
from gpulse.training import Run

FLOOD_S = 2.0
MAX_QUEUE = 20_000


def test_a_flooded_run_keeps_sending_and_accounts_for_every_step(
    clean_env: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "sock" / "agent.sock")
    agent_file = tmp_path / "agent.lp"
    flags = ["--simulate", "1", "--interval", "1", "--flush-interval", "0.2", "--record", str(agent_file)]
    agent = AgentProc([*flags, "--socket", path, "--spool-dir", str(tmp_path / "spool")], clean_env, tmp_path)
    out = tmp_path / "out"
    try:
        wait_until(lambda: Path(path).exists(), what="the agent's socket")
        run = Run(name="flood", output_dir=out, socket_path=path, write_report=False, max_queue=MAX_QUEUE)
        received: list[int] = []
        flooding = True

        def watch() -> None:  # what the agent has counted, while the flood lasts
            while flooding:
                try:
                    received.append(query_status(path, timeout=5)["records_received"])
                except AgentUnreachable as e:  # a loaded machine: the test says so below
                    received.append(-1)
                    print(e)
                time.sleep(0.2)

        watcher = threading.Thread(target=watch)
        watcher.start()
        steps, end = 0, time.monotonic() + FLOOD_S
        with caplog.at_level(logging.WARNING, logger="gpulse.training"):
            while time.monotonic() < end:
                for _ in range(1000):
                    with run.step(samples=1):
                        pass
                steps += 1000
            flooding = False
            watcher.join()
            run.finish()
    finally:
        agent.stop()
    stats = run.stats()
    # the agent heard from the run during the flood, not only at the end
    assert len(received) >= 2 and -1 not in received and received[-1] - received[0] > 1000, received
    # the queue overflowed (this loop is far faster than any worker) and said so once, with the number
    assert stats["steps_not_kept"] > 0 and stats["steps_sent"] + stats["steps_not_kept"] == steps
    said = [r.getMessage() for r in caplog.records if "were not kept" in r.getMessage()]
    assert len(said) == 1 and f"{stats['steps_not_kept']} of {steps} steps were not kept" in said[0]
    # every step that was kept is in the agent's file or the client's (some in both: uploads overwrite)
    kept = {p.fields["step"] for p in recorded(agent_file, "train_step")}
    kept |= {p.fields["step"] for p in recorded(out / RECORD_FILE, "train_step")}
    assert len(kept) == stats["steps_sent"]
