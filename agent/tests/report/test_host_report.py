"""The data-loading finding's cases from a run's host points (``gpulse.report.host``), as the agent
writes them, and the advice each gives. ``test_host_loading.py`` makes the same cases happen for real;
here each case's boundaries are pinned, the ones this 2-core machine cannot show included (cores free)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd
from test_report import make_steps

from gpulse.lineprotocol.encode import Encoder
from gpulse.report.diagnose import Thresholds
from gpulse.report.host import LoadingCase, classify, summarize
from gpulse.report.model import build_report
from gpulse.schema import MEASUREMENTS

S = 1_000_000_000
T0 = 1_700_000_000 * S


def host_rows(
    n: int, cpus: int, idle_pct: float, iowait_pct: float = 0.0, host: str = "n1", every: int = S, t0: int = T0
) -> list[dict]:
    busy = 100.0 - idle_pct - iowait_pct
    return [
        {"time": t0 + i * every, "host": host, "cpus": cpus, "cpu_busy_pct": busy, "cpu_idle_pct": idle_pct,
         "cpu_iowait_pct": iowait_pct, "cpu_steal_pct": 0.0, "disk_busy_pct": 40.0, "mem_available_bytes": 8 << 30}
        for i in range(n)
    ]  # fmt: skip


def process_rows(
    n: int,
    workers: int,
    worker: dict,
    main: dict,
    limit: float | None = None,
    read_bytes_per_s: float = 1e6,
    host: str = "n1",
    run: str = "r1",
    every: int = S,
) -> list[dict]:
    """``n`` samples of a main process and its workers; ``worker``/``main``: fields of every sample,
    with ``running`` and ``disk_sleep`` given as the share of samples where they are 1."""
    rows = []
    for i in range(n):
        for name, figures in [("main", main)] + [(f"worker{w}", worker) for w in range(workers)]:
            row = {"time": T0 + i * every, "host": host, "run": run, "rank": "0", "process": name, "state": "sleeping"}
            row.update(
                cpu_pct=figures["cpu_pct"], read_bytes_per_s=read_bytes_per_s / max(workers, 1),
                running=int(i < n * figures.get("running", 0.0)),
                disk_sleep=int(n - i <= n * figures.get("disk_sleep", 0.0)),
            )  # fmt: skip
            if name == "main":
                row.update(workers=workers, **({"cpu_limit_cores": limit} if limit is not None else {}))
            rows.append(row)
    return rows


T = Thresholds()


def case_of(host: list[dict], procs: list[dict]):
    summary = summarize(host, procs)
    assert summary is not None
    return summary, classify(summary, T)


def test_workers_blocked_on_disk_are_io_bound_and_get_no_worker_advice() -> None:
    s, d = case_of(
        host_rows(10, 8, idle_pct=70.0), process_rows(10, 4, {"cpu_pct": 5.0, "disk_sleep": 0.6}, {"cpu_pct": 20.0})
    )
    assert d.case is LoadingCase.IO_BOUND and s.worker_disk_sleep_ratio == 0.6
    assert "num_workers=" not in d.action and "0.25 MB/s" not in d.evidence and "1.00 MB/s" in d.evidence


def test_high_iowait_alone_is_io_bound() -> None:
    _, d = case_of(host_rows(10, 8, 40.0, iowait_pct=30.0), process_rows(10, 2, {"cpu_pct": 5.0}, {"cpu_pct": 20.0}))
    assert d.case is LoadingCase.IO_BOUND


def test_busy_workers_with_free_cores_get_one_more_worker_per_free_core() -> None:
    s, d = case_of(
        host_rows(10, 8, idle_pct=60.0), process_rows(10, 2, {"cpu_pct": 98.0, "running": 1.0}, {"cpu_pct": 30.0})
    )
    assert d.case is LoadingCase.CPU_BOUND_WORKERS
    assert s.free_cores == pytest.approx(4.8)  # 60% of 8 cores idle
    assert "num_workers=6" in d.action and "at 98% of a core each" in d.evidence


def test_ranks_on_one_host_share_its_free_cores() -> None:
    one = process_rows(10, 2, {"cpu_pct": 98.0, "running": 1.0}, {"cpu_pct": 30.0})
    four = [{**r, "rank": str(k)} for k in range(4) for r in one]
    s, d = case_of(host_rows(10, 16, idle_pct=60.0), four)  # 9.6 cores free, 4 ranks: 2 more workers each
    assert s.ranks_per_host == 4 and "num_workers=4 per rank (4 ranks share the host)" in d.action
    _, none = case_of(host_rows(10, 16, idle_pct=20.0), four)  # 3.2 free: less than one each
    assert "num_workers=" not in none.action and "3.2 core(s) free for its 4 ranks" in none.action


def test_busy_workers_on_a_host_without_a_free_core_get_no_more_workers() -> None:
    s, d = case_of(
        host_rows(10, 2, idle_pct=5.0), process_rows(10, 1, {"cpu_pct": 95.0, "running": 0.9}, {"cpu_pct": 90.0})
    )
    assert d.case is LoadingCase.CPU_BOUND_WORKERS and s.free_cores == pytest.approx(0.1)
    assert "num_workers=" not in d.action and d.action.startswith("Do not add DataLoader workers")


def test_the_training_process_loading_its_own_batches_is_too_few_workers_only_with_a_free_core() -> None:
    procs = process_rows(10, 0, {}, {"cpu_pct": 100.0, "running": 0.9})
    _, free = case_of(host_rows(10, 4, idle_pct=50.0), procs)
    assert free.case is LoadingCase.TOO_FEW_WORKERS and "num_workers=2" in free.action
    _, busy = case_of(host_rows(10, 2, idle_pct=20.0), procs)  # 0.4 cores idle: a worker would only compete
    assert busy.case is LoadingCase.NO_FREE_CORE and "num_workers=" not in busy.action


def test_a_cgroup_limit_the_run_uses_up_leaves_no_free_core_on_an_idle_host() -> None:
    s, d = case_of(
        host_rows(10, 16, idle_pct=90.0), process_rows(10, 0, {}, {"cpu_pct": 100.0, "running": 1.0}, limit=1.0)
    )
    assert s.free_cores == 0.0 and s.cpu_limit_cores == 1.0
    assert d.case is LoadingCase.NO_FREE_CORE and "limited to 1" in d.evidence


def test_sleeping_loaders_are_waiting_elsewhere() -> None:
    _, d = case_of(host_rows(10, 8, idle_pct=80.0), process_rows(10, 2, {"cpu_pct": 1.0}, {"cpu_pct": 5.0}))
    assert d.case is LoadingCase.WAITING_ELSEWHERE and "num_workers=" not in d.action


def test_the_summary_has_every_figure_and_ignores_points_without_figures() -> None:
    procs = process_rows(4, 2, {"cpu_pct": 50.0, "running": 0.5}, {"cpu_pct": 10.0}, limit=4.0)
    procs.append({"time": T0 + 9 * S, "host": "n1", "run": "r1", "rank": "0", "process": "worker1", "state": "gone"})
    s = summarize(host_rows(4, 8, idle_pct=50.0), procs)
    assert s is not None and s.process_samples == 12
    assert [f.name for f in dataclasses.fields(s) if getattr(s, f.name) is None] == []
    assert summarize(host_rows(4, 8, 50.0), [procs[-1]]) is None


def test_the_report_s_finding_carries_the_case_and_its_action() -> None:
    steps = [
        {"time": T0 + i * S, "run": "r1", "rank": "0", "host": "n1", "step": i, "step_time_s": 0.1, "data_wait_s": 0.9}
        for i in range(1, 11)
    ]
    procs = process_rows(10, 2, {"cpu_pct": 98.0, "running": 1.0}, {"cpu_pct": 30.0})
    report = build_report(steps, [], [], [], host=host_rows(10, 8, 60.0), host_process=procs)
    (finding,) = [f for f in report.diagnosis if f.id == "data_loading"]
    assert finding.data["case"] == "cpu_bound_workers" and "num_workers=6" in finding.action
    assert report.to_json()["host"]["workers"] == 2


def write_recording(path: Path, **rows: list[dict]) -> None:
    """Rows of each measurement as line protocol, tags as the schema names them."""
    enc = Encoder()
    lines = []
    for m, points in rows.items():
        tags = MEASUREMENTS[m].all_tags
        for r in points:
            fields = {k: v for k, v in r.items() if k not in tags and k != "time"}
            lines.append(enc.encode(m, {k: str(r[k]) for k in tags if k in r}, fields, r["time"]))
    path.write_text("".join(lines))


def test_the_report_from_influxdb_reads_the_run_s_host_points_as_from_a_file(tmp_path, clean_env, influxdb) -> None:
    """The run's processes by its tag; the host points of its processes' hosts inside its window only."""
    steps = make_steps(wait_s=0.1, host="n1")  # 2 ranks, 20 steps of 0.1 s wait + 0.1 s compute from T0
    every = S // 10
    rec = tmp_path / "rec.lp"
    write_recording(
        rec,
        train_step=steps,
        host=host_rows(30, 8, 60.0, every=every)  # the run's host, inside its window
        + host_rows(5, 8, 0.0, t0=T0 + 3600 * S)  # the same host an hour later: not the run's
        + host_rows(30, 8, 0.0, host="other", every=every),  # another host
        host_process=process_rows(30, 2, {"cpu_pct": 98.0, "running": 1.0}, {"cpu_pct": 30.0}, every=every)
        + process_rows(30, 1, {"cpu_pct": 1.0}, {"cpu_pct": 1.0}, run="another", host="other", every=every),
    )
    influxdb.write(rec.read_text())
    conn = ("--url", influxdb.url, "--api", "v1", "--bucket", "gpulse")
    reports = []
    for name, src in (("db", conn), ("file", ("--from-file", str(rec)))):
        res = subprocess.run(
            gpulse_cmd("report", "--run", "r1", "--out", str(tmp_path / name), "--json", *src),
            env=clean_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        reports.append(json.loads((tmp_path / name / "metrics_report.json").read_text()))
    assert reports[0] == reports[1]
    host = reports[0]["host"]
    assert host["process_samples"] == 90 and host["workers"] == 2  # r1's main and two workers, 30 samples each
    assert host["host_samples"] == 30 and host["free_cores"] == pytest.approx(4.8)  # n1 in the 4 s window only
    (finding,) = [f for f in reports[0]["diagnosis"] if f["id"] == "data_loading"]
    assert finding["data"]["case"] == "cpu_bound_workers"
