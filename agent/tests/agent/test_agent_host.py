"""The agent samples the host beside the GPUs in its cycle (issue 28): a ``host`` point with every GPU
cycle, and ``host_process`` points for each training process the channel names (a run's start point
or its registration) with its workers, from the run's start to its end; ``--no-host-metrics`` turns
it off."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.waiting import wait_until
from test_agent import by_measurement, make_cfg, read_record, run_agent

from gpulse.agent import loop
from gpulse.agent.loop import Agent
from gpulse.channel import protocol
from gpulse.channel.server import TrainingReceiver


def test_every_cycle_writes_a_host_point_with_the_gpus_timestamp_and_the_first_has_no_rates(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "--simulate", "2", "--interval", "0.1", "--duration", "1.2", "--no-socket")
    summary, points = run_agent(cfg)
    m = by_measurement(points)
    host = sorted(m["host"], key=lambda p: p.ts)
    assert [p.ts for p in host] == sorted({p.ts for p in m["gpu"]})
    assert len(host) == summary["samples"] >= 5 and summary["points"]["host"] == len(host)
    assert {p.tags["host"] for p in host} == {"node-t"}
    assert "cpu_busy_pct" not in host[0].fields and host[0].fields["cpus"] == os.cpu_count()
    assert all("cpu_busy_pct" in p.fields and "mem_available_bytes" in p.fields for p in host[1:])
    assert "host_process" not in m  # no channel, no training process


def test_no_host_metrics_leaves_the_host_out(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "--simulate", "1", "--interval", "0.1", "--duration", "0.6", "--no-socket")
    assert not cfg.no_host_metrics
    off = make_cfg(
        tmp_path, "--simulate", "1", "--interval", "0.1", "--duration", "0.6", "--no-socket", "--no-host-metrics"
    )
    summary, points = run_agent(off)
    assert summary["samples"] >= 3 and "host" not in by_measurement(points) and "host" not in summary["points"]


def test_a_run_s_start_point_has_its_process_and_workers_sampled_until_its_end_point(tmp_path: Path) -> None:
    sock_path = str(tmp_path / "run" / "agent.sock")
    cfg = make_cfg(tmp_path, "--simulate", "1", "--interval", "0.1", "--socket", sock_path)
    agent = Agent(cfg, stream=io.StringIO(), tty=False)
    thread = threading.Thread(target=agent.run)
    thread.start()
    # a stand-in training process (no GPU): one forked worker
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60); os._exit(0)\ntime.sleep(60)"
    trainer = subprocess.Popen([sys.executable, "-c", code])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(protocol.client_address())
    tags = {"run": "cpu-run", "rank": "3", "local_rank": "0", "world_size": "4"}

    def send(event: str, seq: int) -> int:
        ts = time.time_ns()
        fields = {"event": event, "status": "running", "name": "cpu-run", "pid": trainer.pid}
        s.sendto(protocol.encode(protocol.Point("train_run", ts, tags, fields, seq=seq)), sock_path)
        return ts

    try:
        wait_until(lambda: os.path.exists(sock_path), what="the agent socket")
        started = send("start", 1)
        time.sleep(1.0)
        ended = send("end", 2)
        time.sleep(1.0)
    finally:
        s.close()
        agent.request_stop()
        thread.join(timeout=30)
        trainer.kill()
        trainer.wait()
    procs = by_measurement(read_record(cfg))["host_process"]
    assert {p.tags["process"] for p in procs} == {"main", "worker0"}
    assert {(p.tags["run"], p.tags["rank"], p.tags["host"]) for p in procs} == {("cpu-run", "3", "node-t")}
    main = [p for p in procs if p.tags["process"] == "main"]
    assert {p.fields["pid"] for p in main} == {trainer.pid} and {p.fields["workers"] for p in main} == {1}
    assert len(main) >= 5  # sampled every cycle of the ~1 s between its start and its end
    # none in the second after its end (the channel handles a datagram within ~0.1 s; 0.5 s of slack)
    assert all(started - 200_000_000 <= p.ts <= ended + 500_000_000 for p in procs)


def test_host_process_series_are_kept_least_recently_used_and_out_of_the_encoder_s_cache(
    tmp_path: Path, monkeypatch
) -> None:
    """A long-lived node sees ever new runs: their host_process series do not pile up anywhere."""
    monkeypatch.setattr(loop, "MAX_PROCESS_SERIES", 2)
    cfg = make_cfg(tmp_path, "--simulate", "1", "--socket", str(tmp_path / "run" / "agent.sock"))
    agent = Agent(cfg, stream=io.StringIO(), tty=False)
    agent.receiver = TrainingReceiver(cfg.socket_path, cfg.host, lambda lines: 0)  # not started: fed directly
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        for k, p in enumerate(sleepers):
            tags = {"run": f"r{k}", "rank": "0", "local_rank": "0", "world_size": "1"}
            start = protocol.Point("train_run", time.time_ns(), tags, {"event": "start", "pid": p.pid}, k)
            agent.receiver.handle_datagram(protocol.encode(start))
        for _ in range(2):  # two cycles: each evicts and rebuilds, nothing piles up
            lines = [line for line in agent._host_lines(time.time_ns()) if line.startswith("host_process,")]
            assert sorted(line.split("run=")[1].split(" ")[0] for line in lines) == ["r0", "r1", "r2"]
            assert [key[0] for key in agent._process_series] == ["r1", "r2"]  # the last two used
        assert not [key for key in agent.encoder._series if key[0] == "host_process"]
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
