"""Which training processes the channel names for the host sampler (``TrainingReceiver.training_processes``):
the registered ones (GPU runs) and those a run's start point names with its ``pid`` (GPU or not), until
their end point, their unregistration, or their end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from support.waiting import eventually
from training_support import Delivery

from gpulse.channel import protocol
from gpulse.channel.server import TrainingReceiver

TAGS = {"run": "r1", "rank": "2", "local_rank": "0", "world_size": "4"}


def run_point(event: str, pid: int, seq: int) -> bytes:
    fields = {"event": event, "status": "running", "name": "r1", "pid": pid}
    return protocol.encode(protocol.Point("train_run", time.time_ns(), TAGS, fields, seq=seq))


def test_a_start_point_names_its_process_until_the_end_point(tmp_path: Path) -> None:
    r = TrainingReceiver(str(tmp_path / "agent.sock"), "node1", Delivery().submit)
    assert r.training_processes() == []
    r.handle_datagram(run_point("start", os.getpid(), 1))
    assert r.training_processes() == [("r1", "2", os.getpid())]
    r.handle_datagram(run_point("end", os.getpid(), 2))
    assert r.training_processes() == []


def test_registered_processes_are_named_and_a_dead_one_is_dropped_at_the_liveness_check(tmp_path: Path) -> None:
    r = TrainingReceiver(str(tmp_path / "agent.sock"), "node1", Delivery().submit).start()
    short = subprocess.Popen([sys.executable, "-c", "pass"])
    short.wait()
    r.handle_datagram(protocol.encode(protocol.Register("r1", "0", os.getpid(), ("GPU-a",), seq=1)))
    r.handle_datagram(run_point("start", short.pid, 2))
    assert r.training_processes() == [("r1", "0", os.getpid()), ("r1", "2", short.pid)]
    try:  # the channel's own liveness check, every LIVENESS_INTERVAL_S
        assert eventually(lambda: r.training_processes() == [("r1", "0", os.getpid())], 10, every=0.1)
    finally:
        r.close()
