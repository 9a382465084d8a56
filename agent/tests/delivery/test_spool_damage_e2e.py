"""Damage in a spool left by an earlier run, seen end to end (issue 15): the real agent replays the spool,
skips the damaged record, and says how much was lost in its self-metrics, in ``gpulse status`` and, once
per damaged segment, in its log."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agentproc import AgentProc
from support.fixtures import gpulse_cmd
from support.waiting import wait_until

from gpulse.delivery.spool import HEADER, Spool
from gpulse.lineprotocol.parse import read_lines

T0 = 1_700_000_000_000_000_000


def batch(k: int) -> list[str]:
    return [f"m,b={k} v={i}i {T0 + 1000 * k + i}\n" for i in range(10)]


def test_a_corrupted_length_field_is_counted_in_self_metrics_status_and_the_log(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    spool_dir = tmp_path / "spool"
    s = Spool(spool_dir / "record", segment_bytes=1 << 20)  # the --record sink's folder
    for k in range(4):
        s.append(batch(k))
    s.close()
    seg = next((spool_dir / "record").glob("*.seg"))
    data = bytearray(seg.read_bytes())
    second = HEADER.size + len("".join(batch(0)))
    data[second + 8 : second + 12] = (0xFFFFFF).to_bytes(4, "little")  # batch 1's payload length
    seg.write_bytes(bytes(data))

    record = tmp_path / "record.lp"
    sock = str(tmp_path / "sock" / "agent.sock")
    args = ["--simulate", "1", "--interval", "0.1", "--self-metrics-interval", "0.2", "--record", str(record)]
    agent = AgentProc([*args, "--spool-dir", str(spool_dir), "--socket", sock], clean_env, tmp_path)
    try:
        wait_until(lambda: record.exists() and "agent," in record.read_text(), what="self-metrics in the record")
        status = subprocess.run(
            gpulse_cmd("status", "--socket", sock), env=clean_env, capture_output=True, text=True, timeout=60
        )
    finally:
        agent.stop()
    assert status.returncode == 0, status.stderr
    assert "damage found at replay: 10 lines lost" in status.stdout

    points = [p for _, _, p in read_lines(record) if not isinstance(p, Exception)]
    replayed = [p for p in points if p.measurement == "m"]
    assert sorted(int(p.tags["b"]) for p in replayed) == sorted([0, 2, 3] * 10)  # batch 1 is what was lost
    agent_points = [p for p in points if p.measurement == "agent"]
    assert agent_points[-1].fields["spool_damaged_lines"] == 10
    assert agent_points[-1].fields["spool_damaged_bytes"] == HEADER.size + len("".join(batch(1)))
    logged = [line for line in agent.stderr.splitlines() if "is damaged" in line]
    assert len(logged) == 1 and "about 10 lines lost" in logged[0]
