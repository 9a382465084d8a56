"""Helpers for the ``test_training_*`` files: a real agent-side receiver and ways to read what arrived."""

from __future__ import annotations

from pathlib import Path

from support.waiting import eventually

from gpulse.channel.recording import read_records
from gpulse.channel.server import TrainingReceiver
from gpulse.lineprotocol.parse import ParsedLine, parse_line


class Delivery:
    """Stands in for the agent's ``Delivery``: keeps submitted lines; everything is durable at once."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def submit(self, lines: list[str]) -> int:
        self.lines.extend(lines)
        return len(self.lines)

    @property
    def durable_upto(self) -> int:
        return len(self.lines)

    def points(self, measurement: str | None = None) -> list[ParsedLine]:
        pts = [parse_line(line) for line in list(self.lines)]
        return [p for p in pts if measurement is None or p.measurement == measurement]


class Agent:
    """The real receiver (``gpulse.channel.server.TrainingReceiver``) on a socket in ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        self.path = str(tmp / "run" / "agent.sock")
        self.delivery = Delivery()
        self.receiver = TrainingReceiver(self.path, "testhost", self.delivery.submit).start()

    def points(self, measurement: str | None = None) -> list[ParsedLine]:
        return self.delivery.points(measurement)

    def close(self) -> None:
        self.receiver.close()


def recorded(path: Path, measurement: str | None = None) -> list[ParsedLine]:
    """Points of a recording file (every line must parse)."""
    out = []
    for lineno, _raw, p in read_records(path):
        assert isinstance(p, ParsedLine), f"line {lineno}: {p}"
        if measurement is None or p.measurement == measurement:
            out.append(p)
    return out


def wait_for(cond, timeout: float = 5.0) -> bool:
    return eventually(cond, timeout, every=0.02)
