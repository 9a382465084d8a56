"""The real agent (loop, NVML source, delivery, record sink) on the NVML stand-in for a few cycles."""

from __future__ import annotations

import argparse
import io
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpulse.agent.config import load_config
from gpulse.agent.loop import Agent
from gpulse.cli.commands import agent as agent_cmd
from gpulse.lineprotocol.parse import ParsedLine, parse_line
from gpulse.sources.nvml.source import NvmlSource
from gpulse.sources.processes import ProcessDescriber
from support.fake_pynvml import FakeGpu, FakeNvml


def record_agent(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gpus: list[FakeGpu],
    describer: ProcessDescriber | None,
    flags: Sequence[str] = (),
) -> list[ParsedLine]:
    """Every point the agent recorded in 1.6 s (0.25 s cycles) on ``gpus``.

    With a ``describer``, processes are sampled every 0.5 s by a source made here; without one the
    agent makes its own source from its settings (``flags`` added), as ``gpulse agent`` does."""
    fake = FakeNvml.install(monkeypatch, gpus=gpus)
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    args = parser.parse_args(["--record", str(tmp_path / "r.lp"), "--no-socket", "--interval", "0.25",
                              "--duration", "1.6", "--spool-dir", str(tmp_path / "spool"), "--host", "node-a",
                              *flags])  # fmt: skip
    source = None if describer is None else NvmlSource(events=False, process_interval_s=0.5, describer=describer)
    assert Agent(load_config(args), source=source, stream=io.StringIO(), tty=False).run() == 0
    fake.check()
    return [parse_line(line) for line in (tmp_path / "r.lp").read_text().splitlines()]


def newest_tags(points: list[ParsedLine], measurement: str) -> dict[str, dict[str, str]]:
    """The tags of the newest point of ``measurement`` per GPU index."""
    out: dict[str, dict[str, str]] = {}
    for p in sorted((p for p in points if p.measurement == measurement), key=lambda p: p.ts):
        out[p.tags["gpu"]] = dict(p.tags)
    return out
