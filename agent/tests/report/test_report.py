"""The run report: its numbers, the HTML file, and ``gpulse report`` from a recording file and from InfluxDB."""

from __future__ import annotations

import json
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from support.fixtures import gpulse_cmd

from gpulse.lineprotocol.encode import Encoder
from gpulse.report.html import render_html
from gpulse.report.model import build_report
from gpulse.report.text import render_text

T0 = 1_700_000_000_000_000_000
S = 10**9


def make_steps(run="r1", ranks=2, n=20, step_s=0.1, wait_s=0.01, slow_rank=None, host="node1"):
    """Steps laid end to end: each rank waits ``wait_s`` for data, then computes ``step_s``."""
    rows = []
    for rank in range(ranks):
        t = T0
        dt = step_s * (2 if rank == slow_rank else 1)
        for i in range(n):
            t += int((wait_s + dt) * S)
            rows.append(
                {
                    "time": t,
                    "run": run,
                    "rank": str(rank),
                    "local_rank": str(rank),
                    "world_size": str(ranks),
                    "host": host,
                    "step": i,
                    "step_time_s": dt,
                    "data_wait_s": wait_s,
                    "forward_s": dt * 0.3,
                    "backward_s": dt * 0.5,
                    "optimizer_s": dt * 0.1,
                    "samples": 8,
                    "tokens": 8 * 128,
                    "samples_per_s": 8 / dt,
                    "tokens_per_s": 8 * 128 / dt,
                    "mfu": 0.4,
                    "tflops": 100.0,
                    "mem_peak_bytes": (rank + 1) * 2**30,
                    "mem_allocated_bytes": 2**29,
                    "mem_reserved_bytes": 3 * 2**30,
                    "alloc_retries": 0,
                    "end_time_ns": t,
                    "start_time_ns": t - int(dt * S),
                }
            )
    return rows


def make_gpu(n=30, gpus=2, util=(90.0, 90.0), throttled_every=0, run="r1", host="node1", power=200.0):
    rows = []
    for i in range(n):
        for g in range(gpus):
            rows.append(
                {
                    "time": T0 + i * S,
                    "host": host,
                    "gpu": str(g),
                    "uuid": f"GPU-{g}",
                    "model": "Sim",
                    "run": run,
                    "util_gpu_pct": util[g],
                    "sm_active_pct": 70.0,
                    "mem_used_bytes": 40 * 2**30,
                    "mem_total_bytes": 80 * 2**30,
                    "power_w": power,
                    "energy_mj": int(i * power * 1000),
                    "throttled": int(bool(throttled_every) and i % throttled_every == 0),
                    "clk_hw_thermal": 0,
                }
            )
    return rows


def test_report_fields_follow_from_the_steps_and_gpu_samples():
    steps = make_steps()
    r = build_report(steps, make_gpu(), [], [])
    assert r.run.id == "r1" and r.run.world_size == 2 and r.run.ranks == [0, 1]
    assert r.train_steps == 20
    assert r.train_runtime == pytest.approx(20 * 0.11, rel=1e-6)
    assert r.train_samples_per_second == pytest.approx(2 * 20 * 8 / 2.2, rel=1e-3)
    assert r.train_steps_per_second == pytest.approx(20 / 2.2, rel=1e-3)
    assert r.train_tokens_per_second == pytest.approx(2 * 20 * 8 * 128 / 2.2, rel=1e-3)
    assert r.data_loading_time_ratio == pytest.approx(0.01 / 0.11, abs=1e-4)
    assert r.communication_time_ratio is None  # not measured, not zero
    assert r.gpu_peak_memory_allocated_gb == 2.0
    assert r.mfu == pytest.approx(0.4) and r.tflops_per_gpu == pytest.approx(100.0)
    assert r.gpu_avg_utilization_percent == 90.0 and r.gpu_max_utilization_percent == 90.0
    assert r.gpu_avg_sm_active_percent == 70.0
    # 2 GPUs x 29 s x 200 W from the energy counter
    assert r.energy_kwh == pytest.approx(2 * 29 * 200 / 3.6e6, rel=1e-6)
    assert r.energy_j_per_step == pytest.approx(2 * 29 * 200 / 20, rel=1e-6)
    assert r.throttle_time_ratio == 0.0
    assert r.phases_s["forward"] == pytest.approx(0.03) and r.phases_s["other"] == pytest.approx(0.01)
    assert [x.slowdown_vs_median for x in r.per_rank] == [1.0, 1.0]
    assert len(r.per_gpu) == 2 and r.diagnosis == []


def test_energy_falls_back_to_power_times_time_without_the_counter():
    gpu = [{k: v for k, v in row.items() if k != "energy_mj"} for row in make_gpu(n=11, gpus=1, power=100.0)]
    r = build_report(make_steps(ranks=1), gpu, [], [])
    assert r.energy_kwh == pytest.approx(10 * 100 / 3.6e6, rel=1e-6)


def test_the_run_end_point_gives_runtime_status_and_gpus():
    steps = make_steps(ranks=1)
    runs = [
        {"time": T0, "run": "r1", "rank": "0", "event": "start", "status": "running", "name": "exp"},
        {
            "time": T0 + 5 * S,
            "run": "r1",
            "rank": "0",
            "event": "end",
            "status": "failed",
            "duration_s": 5.0,
            "gpus": "GPU-0",
        },
    ]
    r = build_report(steps, [], runs, [])
    assert (r.train_runtime, r.run.status, r.run.gpus, r.run.name) == (
        5.0,
        "failed",
        ["GPU-0"],
        "exp",
    )


def test_null_and_missing_fields_are_ignored_not_counted_as_zero():
    steps = make_steps(ranks=1, n=4)
    for row in steps:
        row["mfu"] = None
        del row["tokens"]
    r = build_report(steps, [], [], [])
    assert r.mfu is None and r.train_tokens_per_second is None and r.train_samples == 32


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.external: list[str] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href") and v and not v.startswith("#"):
                self.external.append(v)
            if k == "id":
                self.ids.append(v)


def test_html_report_is_one_self_contained_file_with_the_diagnosis_before_the_plots():
    steps = make_steps(slow_rank=1)
    gpu = make_gpu(util=(90.0, 20.0), throttled_every=2)
    events = [{"time": T0 + 2 * S, "run": "r1", "rank": "0", "kind": "checkpoint", "text": "ckpt <1>", "step": 10}]
    r = build_report(steps, gpu, [], events)
    html = render_html(r, steps, gpu, events)
    p = _Collector()
    p.feed(html)
    p.close()
    assert p.tags.count("svg") == 6  # GPU util/SM, phases, throughput, step memory, GPU memory, rank spread
    assert p.external == [] and "<script" not in html
    assert html.index('id="diagnosis"') < html.index("<svg")
    assert "ckpt &lt;1&gt;" in html and "ckpt <1>" not in html  # text is escaped
    for f in r.diagnosis:
        assert f.title in html
    assert {"rank_imbalance", "gpu_imbalance", "throttling"} <= {f.id for f in r.diagnosis}


def _write_recording(path: Path, steps, gpu, runs=(), gpu_events=(), gpu_process=()) -> None:
    enc = Encoder()
    lines = []
    measurements = (("train_step", steps), ("gpu", gpu), ("train_run", runs), ("gpu_event", gpu_events))
    for m, rows in (*measurements, ("gpu_process", gpu_process)):
        tag_keys = ("run", "rank", "local_rank", "world_size", "host", "gpu", "uuid", "model")
        for row in rows:
            tags = {
                k: row[k]
                for k in tag_keys
                if k in row and (m != "gpu" or k not in ("rank", "local_rank", "world_size"))
            }
            fields = {k: v for k, v in row.items() if k not in tag_keys and k != "time"}
            lines.append(enc.encode(m, tags, fields, row["time"]))
    path.write_text("".join(lines))


def test_gpulse_report_from_a_file_picks_its_only_run_and_writes_json_and_html(tmp_path, clean_env):
    rec = tmp_path / "rec.lp"
    _write_recording(rec, make_steps(wait_s=0.1), make_gpu())
    out = tmp_path / "out"
    res = subprocess.run(
        gpulse_cmd("report", "--from-file", str(rec), "--out", str(out), "--html"),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.index("DIAGNOSIS") < res.stdout.index("RUN")
    assert "[data_loading]" in res.stdout
    report = json.loads((out / "metrics_report.json").read_text())
    assert report["run"]["id"] == "r1" and report["train_steps"] == 20 and len(report["per_gpu"]) == 2
    assert (out / "metrics_report.html").read_text().count("<svg") == 6
    res = subprocess.run(
        gpulse_cmd("report", "--from-file", str(rec), "--out", str(out), "--json", "--threshold", "data_loading_ratio=0.9"),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0 and json.loads(res.stdout)["diagnosis"] == []


def test_gpulse_report_names_the_runs_when_a_file_holds_several_and_rejects_unknown_thresholds(tmp_path, clean_env):
    rec = tmp_path / "rec.lp"
    _write_recording(rec, make_steps(run="a", ranks=1) + make_steps(run="b", ranks=1), [])
    res = subprocess.run(
        gpulse_cmd("report", "--from-file", str(rec)), env=clean_env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "choose one with --run: a, b" in res.stderr
    res = subprocess.run(
        gpulse_cmd("report", "--from-file", str(rec), "--run", "a", "--threshold", "nope=1"),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and "unknown threshold 'nope'" in res.stderr


def test_gpulse_report_from_influxdb_equals_the_report_from_the_same_points_in_a_file(tmp_path, clean_env, influxdb):
    """GPU samples without a run tag are those of the devices the run's ranks report, over the run's
    window; other GPUs (here another host's) are not the run's, nor their events."""
    rec = tmp_path / "rec.lp"
    gpu = [{k: v for k, v in row.items() if k != "run"} for row in make_gpu()]
    other = [{**r, "uuid": f"GPU-n2-{r['gpu']}"} for r in make_gpu(host="node2", util=(5.0, 5.0))]
    runs = [{"time": T0, "run": "r1", "rank": "0", "host": "node1", "event": "start", "status": "running",
             "gpus": "GPU-0,GPU-1"}]  # fmt: skip
    xids = [
        {
            "time": T0 + 2 * S,
            "host": h,
            "gpu": "1",
            "uuid": u,
            "model": "Sim",
            "kind": "xid",
            "xid": 31,
            "text": "fault",
        }
        for h, u in (("node1", "GPU-1"), ("node2", "GPU-n2-1"))
    ]
    _write_recording(
        rec, make_steps(wait_s=0.05), gpu + [{k: v for k, v in r.items() if k != "run"} for r in other], runs, xids
    )
    influxdb.write(rec.read_text())
    out_db, out_file = tmp_path / "db", tmp_path / "file"
    conn = ("--url", influxdb.url, "--api", "v1", "--bucket", "gpulse")
    for out, src in ((out_db, conn), (out_file, ("--from-file", str(rec)))):
        res = subprocess.run(
            gpulse_cmd("report", "--run", "r1", "--out", str(out), "--json", *src),
            env=clean_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    a = json.loads((out_db / "metrics_report.json").read_text())
    b = json.loads((out_file / "metrics_report.json").read_text())
    assert a == b
    assert a["gpu_avg_utilization_percent"] == 90.0 and {g["host"] for g in a["per_gpu"]} == {"node1"}
    assert [(e["host"], e["uuid"], e["xid"]) for e in a["gpu_events"]] == [("node1", "GPU-1", 31)]
    res = subprocess.run(
        gpulse_cmd("report", *conn, "--out", str(tmp_path / "picked")),
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and "run r1" in res.stdout  # the only run in the database is picked


def test_a_report_without_some_ranks_is_partial_and_says_which():
    steps = [r for r in make_steps(ranks=3) if r["rank"] != "2"]
    r = build_report(steps, [], [], [])
    assert r.partial is True and r.partial_reason == "no points from rank(s) 2"
    assert "PARTIAL: this report covers rank(s) 0, 1 of world size 3: no points from rank(s) 2" in render_text(r)
    assert "Partial report" in render_html(r, steps, [], [])
    whole = build_report(make_steps(ranks=3), [], [], [])
    assert whole.partial is False and whole.partial_reason is None and "PARTIAL" not in render_text(whole)
    why = build_report(make_steps(ranks=3), [], [], [], partial_reason="rank(s) 2 did not finish within 30 s")
    assert why.partial is True and why.partial_reason == "rank(s) 2 did not finish within 30 s"


def test_totals_count_every_step_of_a_rank_whose_rows_were_thinned_out():
    """A report buffer keeps every n-th step of a long run; each rank's end point counts all of them."""
    steps = [r for r in make_steps(ranks=2, n=20) if r["step"] % 2 == 0]  # every 2nd step kept
    ends = [
        {"time": T0 + 10 * S, "run": "r1", "rank": str(rank), "event": "end", "status": "finished",
         "steps": 20, "samples": 160, "tokens": 160 * 128, "duration_s": 4.0}
        for rank in (0, 1)
    ]  # fmt: skip
    r = build_report(steps, [], ends, [])
    assert (r.train_steps, r.train_samples, r.train_tokens) == (20, 320, 320 * 128)
    assert r.train_samples_per_second == pytest.approx(80.0)
    assert [x.samples_per_second for x in r.per_rank] == pytest.approx([40.0, 40.0])


def test_a_distributed_run_without_communication_timing_gets_a_one_line_hint():
    steps = make_steps(ranks=2)
    r = build_report(steps, [], [], [])
    assert len(r.hints) == 1 and "attach_ddp(run, ddp_model)" in r.hints[0]
    assert f"  hint: {r.hints[0]}" in render_text(r)
    assert any("no comm_s in the steps" in n and "attach_ddp" in n for n in r.not_evaluated)
    for row in steps:
        row["comm_s"] = 0.001
    assert "Communication in flight was not timed" in build_report(steps, [], [], []).hints[0]
    for row in steps:
        row["comm_in_flight_s"] = 0.002
    assert build_report(steps, [], [], []).hints == []
    assert build_report(make_steps(ranks=1), [], [], []).hints == []  # one process: nothing to time
