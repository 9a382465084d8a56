"""Load one run's points for the report: from InfluxDB (InfluxQL, v1 or v2 via DBRP) or recording files.

A run's GPU samples are the ``gpu`` points tagged ``run=<id>`` (the agent tags the GPUs a run
registered); when there are none (the run never registered, e.g. CPU-only or an older agent),
they are the GPUs of the run's hosts during the run's time window — narrowed to the run's own
GPUs when its ``train_run`` points list them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulse.channel.recording import read_records
from gpulse.influx.query import InfluxQL, quote_ident, quote_string
from gpulse.lineprotocol.parse import LineError
from gpulse.report.model import step_end_ns, step_start_ns

Row = dict[str, Any]
TRAIN_MEASUREMENTS = ("train_step", "train_run", "train_event")


@dataclass
class RunData:
    steps: list[Row] = field(default_factory=list)
    gpu: list[Row] = field(default_factory=list)
    runs: list[Row] = field(default_factory=list)
    events: list[Row] = field(default_factory=list)
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
    return {u for r in runs for u in str(r.get("gpus") or "").split(",") if u}


def select_gpu_rows(gpu: Iterable[Mapping[str, Any]], run: str, steps: Sequence[Row], runs: Sequence[Row]) -> list[Row]:
    """The run's GPU samples among ``gpu`` rows (see the module docstring)."""
    gpu = list(gpu)
    tagged = [dict(r) for r in gpu if r.get("run") == run]
    if tagged:
        return tagged
    window = run_window(steps, runs)
    if window is None:
        return []
    hosts = {r.get("host") for r in [*steps, *runs] if r.get("host")}
    rows = [dict(r) for r in gpu if r.get("host") in hosts and window[0] <= int(r.get("time") or 0) <= window[1]]
    own = run_gpus(runs)
    if own and any(r.get("uuid") in own for r in rows):
        rows = [r for r in rows if r.get("uuid") in own]
    return rows


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


def load_influx(q: InfluxQL, run: str) -> RunData:
    where = f'"run" = {quote_string(run)}'
    data = RunData(
        steps=q.rows(f"SELECT * FROM {_source(q, 'train_step')} WHERE {where}"),
        runs=q.rows(f"SELECT * FROM {_source(q, 'train_run')} WHERE {where}"),
        events=q.rows(f"SELECT * FROM {_source(q, 'train_event')} WHERE {where}"),
    )
    data.gpu = q.rows(f"SELECT * FROM {_source(q, 'gpu')} WHERE {where}")
    if not data.gpu:
        window = run_window(data.steps, data.runs)
        hosts = sorted({str(r["host"]) for r in [*data.steps, *data.runs] if r.get("host")})
        if window and hosts:
            data.gpu = select_gpu_rows(_on_hosts(q, "gpu", hosts, window), run, data.steps, data.runs)
    data.host_process = q.rows(f"SELECT * FROM {_source(q, 'host_process')} WHERE {where}")
    scope = host_filter(data.host_process, data.steps, data.runs)
    if scope is not None:
        data.host = _on_hosts(q, "host", sorted(scope[0]), scope[1])
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
    data.gpu = select_gpu_rows(rows.get("gpu", []), run, data.steps, data.runs)
    data.host_process = pick("host_process")
    scope = host_filter(data.host_process, data.steps, data.runs)
    if scope is not None:
        hosts, (t0, t1) = scope
        data.host = [r for r in rows.get("host", []) if r.get("host") in hosts and t0 <= int(r.get("time") or 0) <= t1]
    return data
