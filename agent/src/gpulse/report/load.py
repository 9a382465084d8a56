"""Load one run's points for the report: from InfluxDB (InfluxQL, v1 or v2 via DBRP) or recording files.

A GPU is a run's only when one of its ranks uses it: the agent tags the GPUs a run registered
(``gpu`` points with ``run=<id>``); without such points, the run's GPUs are those its ranks report
(``train_run.gpus``, the CUDA devices' UUIDs) and those NVML lists one of its processes on
(``gpu_process.pid`` equal to a rank's ``train_run.pid`` on the same host), over the run's time
window. A CPU-only run beside an agent gets no GPU, and so no GPU figures: the GPUs of its host
are not its own. The GPU events (XID, ECC, lost) are those of the run's GPUs during the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulse.channel.recording import read_records
from gpulse.influx.query import InfluxQL
from gpulse.influx.quoting import quote_ident, quote_string
from gpulse.lineprotocol.parse import LineError
from gpulse.report.model import step_end_ns, step_start_ns

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

    @property
    def empty(self) -> bool:
        return not (self.steps or self.runs or self.events)


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
    tagged = [dict(r) for r in gpu if r.get("run") == run]
    if tagged:
        return tagged
    window = run_window(steps, runs)
    if window is None:
        return []
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
def _source(q: InfluxQL, measurement: str) -> str:
    rp = q.conn.retention_policy
    if rp:
        return f"{quote_ident(q.conn.database)}.{quote_ident(rp)}.{quote_ident(measurement)}"
    return quote_ident(measurement)


def list_runs_influx(q: InfluxQL) -> list[str]:
    runs: set[str] = set()
    for m in ("train_run", "train_step"):
        for row in q.rows(f'SHOW TAG VALUES FROM {_source(q, m)} WITH KEY = "run"'):
            if row.get("value"):
                runs.add(str(row["value"]))
    return sorted(runs)


def _any_of(tag: str, values: Iterable[str]) -> str:
    return "(" + " OR ".join(f"{quote_ident(tag)} = {quote_string(v)}" for v in sorted(values)) + ")"


def load_influx(q: InfluxQL, run: str) -> RunData:
    where = f'"run" = {quote_string(run)}'
    data = RunData(
        steps=q.rows(f"SELECT * FROM {_source(q, 'train_step')} WHERE {where}"),
        runs=q.rows(f"SELECT * FROM {_source(q, 'train_run')} WHERE {where}"),
        events=q.rows(f"SELECT * FROM {_source(q, 'train_event')} WHERE {where}"),
    )
    data.gpu = q.rows(f"SELECT * FROM {_source(q, 'gpu')} WHERE {where}")
    data.host_process = q.rows(f"SELECT * FROM {_source(q, 'host_process')} WHERE {where}")
    scope = host_filter(data.host_process, data.steps, data.runs)
    if scope is not None:
        data.host = _on_hosts(q, "host", sorted(scope[0]), scope[1])
    window = run_window(data.steps, data.runs)
    if window is None:
        return data
    between = f"time >= {window[0]} AND time <= {window[1]}"
    hosts = {str(r["host"]) for r in data.runs if r.get("host")}
    if not data.gpu and hosts:
        near = f"time >= {window[0] - PROCESS_MARGIN_NS} AND time <= {window[1] + PROCESS_MARGIN_NS}"
        procs = q.rows(
            f'SELECT "pid", "uuid", "host" FROM {_source(q, "gpu_process")} WHERE {_any_of("host", hosts)} AND {near}'
        )
        own = owned_gpus(data.runs, procs)
        if own:
            rows = q.rows(f"SELECT * FROM {_source(q, 'gpu')} WHERE {_any_of('uuid', own)} AND {between}")
            data.gpu = select_gpu_rows(rows, run, data.steps, data.runs, procs)
    uuids = {str(r["uuid"]) for r in data.gpu if r.get("uuid")}
    if uuids:
        events = q.rows(f"SELECT * FROM {_source(q, 'gpu_event')} WHERE {_any_of('uuid', uuids)} AND {between}")
        data.gpu_events = select_gpu_events(events, data.gpu, window)
    return data


def _on_hosts(q: InfluxQL, measurement: str, hosts: Sequence[str], window: tuple[int, int]) -> list[Row]:
    """Every point of ``measurement`` from ``hosts`` inside ``window`` (Unix ns, both ends included)."""
    host_clause = " OR ".join(f'"host" = {quote_string(h)}' for h in hosts)
    return q.rows(
        f"SELECT * FROM {_source(q, measurement)} WHERE ({host_clause}) AND time >= {window[0]} AND time <= {window[1]}"
    )


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
