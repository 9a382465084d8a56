"""What `gpulse setup` shares between InfluxDB 2.x and 1.x: the report, the errors, the server probe.

The probe is the one every command uses (:mod:`gpulse.influx.server`); here its problems become :class:`SetupError`.

Setup is declarative: each step compares what exists with what should exist and acts only on a
difference, so re-running it changes nothing and a changed definition is brought up to date. The
:class:`SetupReport` records every decision, so tests and the CLI can show exactly what was done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulse.influx import server
from gpulse.influx.connection import Connection
from gpulse.influx.durations import parse_duration
from gpulse.influx.http import HttpClient, TransportError
from gpulse.influx.server import ServerInfo
from gpulse.influx.tiers import RAW, RAW_RETENTION, TIERS

__all__ = [
    "ServerInfo",
    "SetupError",
    "SetupReport",
    "check_health",
    "influx_duration",
    "probe",
    "retentions",
    "shard_group_seconds",
]


class SetupError(Exception):
    """Setup cannot go on; the message says what is wrong and how to fix it."""


@dataclass
class SetupReport:
    """Every object setup looked at, with what it did: created, updated, deleted or unchanged."""

    actions: list[tuple[str, str]] = field(default_factory=list)

    def add(self, action: str, what: str) -> None:
        self.actions.append((action, what))

    def changed(self) -> list[str]:
        return [f"{a} {w}" for a, w in self.actions if a != "unchanged"]

    def lines(self) -> list[str]:
        return [f"{a:9} {w}" for a, w in self.actions]

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for a, _ in self.actions:
            counts[a] = counts.get(a, 0) + 1
        return ", ".join(f"{n} {a}" for a, n in counts.items()) or "nothing to do"


def retentions(raw: str = RAW_RETENTION, minute: str | None = None) -> dict[str, int]:
    """tier name -> retention in seconds (0 = forever), validated."""
    out = {RAW: raw}
    for t in TIERS:
        out[t.name] = minute if (minute and t.name == "1m") else t.retention
    try:
        secs = {name: parse_duration(text) // 10**9 for name, text in out.items()}
    except ValueError as e:
        raise SetupError(str(e)) from None
    if secs[RAW] and secs[RAW] < 3600:
        raise SetupError(f"raw retention {raw!r} is shorter than an hour; the downsampling needs the raw points longer")
    return secs


def shard_group_seconds(retention_s: int) -> int:
    """The shard-group duration InfluxDB gives a retention it creates (0 = forever).

    The same rule in 1.x and 2.9 (``shardGroupDuration`` in ``v1/services/meta/data.go``; the 2.x
    bucket service applies it through ``meta.NormalisedShardDuration``, ``storage/bucket_service.go``).
    A retention changed later keeps its old shard-group duration unless one is given, and a
    retention shorter than it is refused (1.x: "retention policy duration must be greater than the
    shard duration"; 2.9: 422 "shard-group duration must also be updated to be smaller than new
    retention duration", ``storage/engine.go`` ``UpdateBucketRetentionPolicy``): setup sends this
    value with every retention it changes, so a bucket ends as it would have been created.
    """
    day = 86400
    if retention_s == 0 or retention_s >= 180 * day:
        return 7 * day
    if retention_s >= 2 * day:
        return day
    return 3600


def influx_duration(seconds: int) -> str:
    """An InfluxQL duration literal for a retention: ``INF`` for 0, else whole days/hours/seconds."""
    if seconds == 0:
        return "INF"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def probe(conn: Connection) -> ServerInfo:
    """The shared server probe (:func:`gpulse.influx.server.probe_with`: ``/ping`` with the connection's
    credentials, as InfluxDB 3 asks), its problems as setup's errors."""
    try:
        return server.probe_with(conn)
    except server.ServerProblem as e:
        raise SetupError(str(e)) from None


def check_health(url: str, timeout: float = 10.0) -> None:
    """``GET /health`` (2.x): JSON with ``status: pass`` once InfluxDB serves queries and writes."""
    try:
        with HttpClient(url, timeout_s=timeout) as client:
            r = client.request("GET", "/health")
    except TransportError as e:
        raise SetupError(f"{e}; is InfluxDB running there?") from None
    try:
        health = r.json()
        status, message = health["status"], health.get("message", "")
    except (ValueError, KeyError, TypeError):
        raise SetupError(
            f"{url}/health did not answer InfluxDB's health JSON: is this InfluxDB 2.x? (check --url)"
        ) from None
    if status != "pass":
        raise SetupError(f"InfluxDB at {url} is not ready: {status} ({message})")
