"""Load one run's points for the report: from InfluxDB (InfluxQL, v1 or v2 via DBRP) or recording files.

A GPU is a run's only when one of its ranks uses it: the agent tags the GPUs a run registered
(``gpu`` points with ``run=<id>``); without such points, the run's GPUs are those its ranks report
(``train_run.gpus``, the CUDA devices' UUIDs) and those NVML lists one of its processes on
(``gpu_process.pid`` equal to a rank's ``train_run.pid`` on the same host), over the run's time
window. A CPU-only run beside an agent gets no GPU, and so no GPU figures: the GPUs of its host
are not its own. The GPU events (XID, ECC, lost) are those of the run's GPUs during the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulse.channel.recording import read_records
from gpulse.influx.durations import parse_duration
from gpulse.influx.query import InfluxQL, QueryError
from gpulse.influx.quoting import quote_ident, quote_string
from gpulse.influx.tiers import RAW, TIER_BY_NAME
from gpulse.lineprotocol.parse import LineError
from gpulse.report.model import build_report, step_end_ns, step_start_ns
from gpulse.report.records import RunReport

Row = dict[str, Any]
TRAIN_MEASUREMENTS = ("train_step", "train_run", "train_event")
#: How far around the run's window its processes are looked for on the GPUs: the agent lists a GPU's
#: processes only every few seconds, so a short run may fall between two listings.
PROCESS_MARGIN_NS = 30 * 10**9


@dataclass
class RunData:
    steps: list[Row] = field(default_factory=list)
    gpu: list[Row] = field(default_factory=list)
    runs: list[Row] = field(default_factory=list)
    events: list[Row] = field(default_factory=list)
    #: ``gpu_event`` rows of the run's GPUs during the run
    gpu_events: list[Row] = field(default_factory=list)
    #: the agent's points of the run's processes (tagged with the run) and of their hosts in the run's window
    host_process: list[Row] = field(default_factory=list)
    host: list[Row] = field(default_factory=list)
    #: lines of the input files that could not be read (line number, file, why)
    bad_lines: list[tuple[str, int, str]] = field(default_factory=list)
    #: the tier the points come from: raw, or 1m for a run older than raw retention (per-minute means)
    tier: str = RAW

    @property
    def empty(self) -> bool:
        return not (self.steps or self.runs or self.events)

    def report(self, thresholds: Mapping[str, float] | None = None) -> RunReport:
        """The run's report from these points: the one place a loaded run becomes a report."""
        return build_report(
            self.steps,
            self.gpu,
            self.runs,
            self.events,
            thresholds,
            gpu_events=self.gpu_events,
            host=self.host,
            host_process=self.host_process,
        )


def run_window(steps: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]) -> tuple[int, int] | None:
    """(start, end) Unix ns of a run: its steps (from the first batch wait) and its start/end points."""
    times = [step_start_ns(r) for r in steps] + [step_end_ns(r) for r in steps]
    times += [int(r["time"]) for r in runs if r.get("time") is not None]
    return (min(times), max(times)) if times else None


def run_gpus(runs: Sequence[Mapping[str, Any]]) -> set[str]:
    """UUIDs of the CUDA devices the run's ranks report (``train_run.gpus``)."""
    return {u for r in runs for u in str(r.get("gpus") or "").split(",") if u}


def run_pids(runs: Sequence[Mapping[str, Any]]) -> set[tuple[str, int]]:
    """(host, pid) of the run's ranks, from their ``train_run`` points."""
    return {(str(r["host"]), pid) for r in runs if r.get("host") and (pid := _pid(r)) is not None}


def _pid(row: Mapping[str, Any]) -> int | None:
    v = row.get("pid")
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def owned_gpus(runs: Sequence[Mapping[str, Any]], processes: Iterable[Mapping[str, Any]]) -> set[str]:
    """UUIDs of the GPUs the run's ranks use: the devices they report, and those NVML lists one of
    their processes on (``gpu_process`` rows of the same host)."""
    pids = run_pids(runs)
    listed = {str(p["uuid"]) for p in processes if p.get("uuid") and (str(p.get("host")), _pid(p)) in pids}
    return run_gpus(runs) | listed


def select_gpu_rows(
    gpu: Iterable[Mapping[str, Any]],
    run: str,
    steps: Sequence[Row],
    runs: Sequence[Row],
    processes: Iterable[Mapping[str, Any]] = (),
) -> list[Row]:
    """The run's GPU samples among ``gpu`` rows (see the module docstring)."""
    gpu = list(gpu)
    window = run_window(steps, runs)
    if window is None:
        return []
    # the run's window bounds tagged samples too: a database read covers only the run's span, and
    # a recording's report must not count the samples taken after its last step that it does not
    tagged = [dict(r) for r in gpu if r.get("run") == run and window[0] <= int(r.get("time") or 0) <= window[1]]
    if tagged:
        return tagged
    lo, hi = window[0] - PROCESS_MARGIN_NS, window[1] + PROCESS_MARGIN_NS
    own = owned_gpus(runs, (p for p in processes if lo <= int(p.get("time") or 0) <= hi))
    return [dict(r) for r in gpu if r.get("uuid") in own and window[0] <= int(r.get("time") or 0) <= window[1]]


def select_gpu_events(
    gpu_events: Iterable[Mapping[str, Any]], gpu: Sequence[Row], window: tuple[int, int] | None
) -> list[Row]:
    """The events of the run's GPUs (those of its ``gpu`` rows) during its window."""
    uuids = {r.get("uuid") for r in gpu if r.get("uuid")}
    if window is None or not uuids:
        return []
    return [dict(e) for e in gpu_events if e.get("uuid") in uuids and window[0] <= int(e.get("time") or 0) <= window[1]]


def host_filter(
    processes: Sequence[Row], steps: Sequence[Row], runs: Sequence[Row]
) -> tuple[set[str], tuple[int, int]] | None:
    """The hosts of the run's sampled processes and the run's window: which ``host`` points are the run's."""
    window = run_window(steps, runs)
    hosts = {str(r["host"]) for r in processes if r.get("host")}
    return (hosts, window) if window and hosts else None


# -- InfluxDB ---------------------------------------------------------------------------------------
#: Every read names a time range, and steps and GPU samples are read a day at a time: InfluxDB 3
#: Core refuses a query over more Parquet files than its limit (``--query-file-limit``, about 3 days
#: of raw data), and answers a ``SHOW TAG VALUES`` without a range from its last day only.
DAY_NS = 86_400 * 1_000_000_000
#: Where a run's records are looked for, newest first: the last day, week, month, the 1m tier's
#: retention, then anything older (a 1.x database keeps raw points forever by default). The search
#: stops at the first window that holds the run, so a recent run costs one small query.
SEARCH_WINDOWS_NS = (DAY_NS, 7 * DAY_NS, 30 * DAY_NS, parse_duration(TIER_BY_NAME["1m"].retention))
#: A run with no end record (still running, or killed) ends where its steps stop for this long.
QUIET_DAYS = 2


@dataclass(frozen=True)
class RunSpan:
    """Where a run's points are: the tier that covers it, and the range to read (Unix ns, inclusive)."""

    tier: str
    start_ns: int
    end_ns: int


def _source(q: InfluxQL, measurement: str, tier: str = RAW) -> str:
    """A measurement of a tier. The 1m tier is named with the database (``"gpulse"."1m"."gpu"``):
    the 1.x retention policy, the 2.x DBRP mapping and, on InfluxDB 3, the database ``gpulse/1m``."""
    if tier != RAW:
        return f"{quote_ident(q.conn.database)}.{quote_ident(tier)}.{quote_ident(measurement)}"
    rp = q.conn.retention_policy
    if rp:
        return f"{quote_ident(q.conn.database)}.{quote_ident(rp)}.{quote_ident(measurement)}"
    return quote_ident(measurement)


def _windows(now_ns: int) -> list[tuple[int, int]]:
    """The search windows ``[a, b)``, newest first, back to the epoch."""
    out, end = [], now_ns + 1
    for back in SEARCH_WINDOWS_NS:
        out.append((now_ns - back, end))
        end = now_ns - back
    return [*out, (0, end)]


def list_runs_influx(q: InfluxQL, now_ns: int | None = None) -> list[str]:
    """Runs with a start/end record in raw (few points: searched back to the epoch) or steps in the
    1m tier (over its retention)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    runs: set[str] = set()
    for m, tier, since in (("train_run", RAW, 0), ("train_step", "1m", now_ns - SEARCH_WINDOWS_NS[-1])):
        show = f'SHOW TAG VALUES FROM {_source(q, m, tier)} WITH KEY = "run" WHERE time >= {since} AND time <= {now_ns}'
        for row in _rows_if_tier(q, show, tier):
            if row.get("value"):
                runs.add(str(row["value"]))
    return sorted(runs)


def _any_of(tag: str, values: Iterable[str]) -> str:
    return "(" + " OR ".join(f"{quote_ident(tag)} = {quote_string(v)}" for v in sorted(values)) + ")"


def _rows_if_tier(q: InfluxQL, query: str, tier: str) -> list[Row]:
    """Rows of a query, none when its downsampled tier does not exist: a database that ``gpulse setup``
    did not make has no 1m tier, and so no run in it (InfluxDB says its retention policy or database is
    not found). The raw tier's absence is an error with its advice (a wrong database or bucket)."""
    if tier == RAW:
        return q.rows(query)
    try:
        return q.rows(query)
    except QueryError as e:
        if "not found" in e.message:
            return []
        raise


def _first_last(
    q: InfluxQL, source: str, field: str, where: str, now_ns: int, tier: str = RAW
) -> tuple[Row, Row] | None:
    """The first and last point (``time`` and ``field``) matching ``where``, searching the windows
    newest first and going on into older ones while they still hold points."""
    first: Row | None = None
    last: Row | None = None
    for a, b in _windows(now_ns):
        rows = _rows_if_tier(
            q, f'SELECT first("{field}") FROM {source} WHERE {where} AND time >= {a} AND time < {b}', tier
        )
        if not rows:
            if first is not None:
                break
            continue
        first = rows[0]
        if last is None:
            (last,) = q.rows(f'SELECT last("{field}") FROM {source} WHERE {where} AND time >= {a} AND time < {b}')
    return (first, last) if first is not None and last is not None else None


def run_span(q: InfluxQL, run: str, now_ns: int | None = None) -> RunSpan | None:
    """The run's time range and the tier that covers it.

    Raw covers the run while it holds the run's ``train_run`` records (its steps are kept as long), or
    its steps where the records never came; without either the 1m tier holds the whole run (older than
    raw retention), read at 1-minute resolution.
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    where = f'"run" = {quote_string(run)}'
    records = _first_last(q, _source(q, "train_run"), "event", where, now_ns)
    if records is not None:
        first, last = records
        end = int(last["time"]) if last.get("last") == "end" else _last_step_day(q, where, int(first["time"]), now_ns)
        return RunSpan(RAW, int(first["time"]), end)
    for tier in (RAW, "1m"):  # no records (steps uploaded without them, or a run older than raw retention)
        steps = _first_last(q, _source(q, "train_step", tier), "step", where, now_ns, tier)
        if steps is not None:
            return RunSpan(tier, int(steps[0]["time"]), int(steps[1]["time"]))
    return None


def _last_step_day(q: InfluxQL, where: str, start_ns: int, now_ns: int) -> int:
    """The end of the last day with steps of a run without an end record: days are read from its
    start until :data:`QUIET_DAYS` in a row hold none (or now)."""
    end, quiet = start_ns, 0
    for a in range(start_ns, now_ns + 1, DAY_NS):
        rows = q.rows(
            f'SELECT last("step") FROM {_source(q, "train_step")} WHERE {where} AND time >= {a} AND time < {a + DAY_NS}'
        )
        if rows:
            end, quiet = int(rows[0]["time"]), 0
        else:
            quiet += 1
            if quiet >= QUIET_DAYS:
                break
    return end


def _days(span: RunSpan) -> list[tuple[int, int]]:
    """The span as consecutive day-long ``[a, b)`` windows."""
    return [(a, min(a + DAY_NS, span.end_ns + 1)) for a in range(span.start_ns, span.end_ns + 1, DAY_NS)]


def _read(q: InfluxQL, measurement: str, where: str, span: RunSpan) -> list[Row]:
    """Every point of ``measurement`` in the span's tier matching ``where``, a day at a time."""
    rows: list[Row] = []
    for a, b in _days(span):
        rows += q.rows(
            f"SELECT * FROM {_source(q, measurement, span.tier)} WHERE {where} AND time >= {a} AND time < {b}"
        )
    return rows


def load_influx(q: InfluxQL, run: str, now_ns: int | None = None) -> RunData:
    """The run's points from the tier that covers it (:func:`run_span`), read a day at a time.

    ``train_run`` and ``train_event`` are kept in raw only: a run read from the 1m tier has its
    steps (per-minute means per rank) and its GPUs' samples."""
    span = run_span(q, run, now_ns)
    if span is None:
        return RunData()
    where = f'"run" = {quote_string(run)}'
    data = RunData(steps=_read(q, "train_step", where, span), tier=span.tier)
    if span.tier == RAW:
        data.runs = _read(q, "train_run", where, span)
        data.events = _read(q, "train_event", where, span)
    data.gpu = _read(q, "gpu", where, span)
    # the agent samples a run's processes from its start record on, before its first step: a margin
    # as for its GPU processes keeps those samples, as a recording does
    margin = RunSpan(span.tier, span.start_ns - PROCESS_MARGIN_NS, span.end_ns + PROCESS_MARGIN_NS)
    data.host_process = _read(q, "host_process", where, margin)
    scope = host_filter(data.host_process, data.steps, data.runs)
    if scope is not None:
        on_hosts, (t0, t1) = scope
        data.host = _read(q, "host", _any_of("host", on_hosts), RunSpan(span.tier, t0, t1))
    window = run_window(data.steps, data.runs)
    if window is None:
        return data
    hosts = {str(r["host"]) for r in data.runs if r.get("host")}
    if not data.gpu and hosts:
        # the GPUs NVML lists a rank's PID on: processes are listed every few seconds, so look a
        # little either side of the run
        near = RunSpan(span.tier, window[0] - PROCESS_MARGIN_NS, window[1] + PROCESS_MARGIN_NS)
        procs = _read(q, "gpu_process", _any_of("host", hosts), near)
        own = owned_gpus(data.runs, procs)
        if own:
            rows = _read(q, "gpu", _any_of("uuid", own), RunSpan(span.tier, *window))
            data.gpu = select_gpu_rows(rows, run, data.steps, data.runs, procs)
    uuids = {str(r["uuid"]) for r in data.gpu if r.get("uuid")}
    if uuids:
        events = _read(q, "gpu_event", _any_of("uuid", uuids), RunSpan(span.tier, *window))
        data.gpu_events = select_gpu_events(events, data.gpu, window)
    return data


# -- recording files --------------------------------------------------------------------------------
def read_points(paths: Iterable[str | Path]) -> tuple[dict[str, list[Row]], list[tuple[str, int, str]]]:
    """Rows per measurement from line-protocol files, deduplicated as InfluxDB would store them.

    The same point may be in an agent ``--record`` file and a client's fallback file; InfluxDB
    keeps one point per series and timestamp (fields merged), and so does this.
    """
    merged: dict[tuple[Any, ...], Row] = {}
    order: dict[tuple[Any, ...], str] = {}
    bad: list[tuple[str, int, str]] = []
    for path in paths:
        for lineno, _raw, p in read_records(path):
            if isinstance(p, LineError):
                bad.append((str(path), lineno, str(p)))
                continue
            if p.ts is None:
                bad.append((str(path), lineno, "no timestamp"))
                continue
            key = (p.measurement, tuple(sorted(p.tags.items())), p.ts)
            row = merged.get(key)
            if row is None:
                merged[key] = p.row()
                order[key] = p.measurement
            else:
                row.update(p.fields)
    out: dict[str, list[Row]] = {}
    for key, row in merged.items():
        out.setdefault(order[key], []).append(row)
    return out, bad


def runs_in(rows: Mapping[str, list[Row]]) -> list[str]:
    return sorted({str(r["run"]) for m in TRAIN_MEASUREMENTS for r in rows.get(m, []) if r.get("run")})


def load_files(rows: Mapping[str, list[Row]], run: str) -> RunData:
    pick = lambda m: [r for r in rows.get(m, []) if r.get("run") == run]  # noqa: E731
    data = RunData(steps=pick("train_step"), runs=pick("train_run"), events=pick("train_event"))
    data.gpu = select_gpu_rows(rows.get("gpu", []), run, data.steps, data.runs, rows.get("gpu_process", []))
    data.gpu_events = select_gpu_events(rows.get("gpu_event", []), data.gpu, run_window(data.steps, data.runs))
    data.host_process = pick("host_process")
    scope = host_filter(data.host_process, data.steps, data.runs)
    if scope is not None:
        hosts, (t0, t1) = scope
        data.host = [r for r in rows.get("host", []) if r.get("host") in hosts and t0 <= int(r.get("time") or 0) <= t1]
    return data
