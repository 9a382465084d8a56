"""The automatic profiler window: a finding asks, a few steps of ``torch.profiler`` are recorded,
read back into evidence, and bounded (per rule per hour, disk, off switches). Real torch on the CPU."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import threading
from html import escape
from pathlib import Path

import pytest
import torch
from support.fixtures import gpulse_cmd
from torch.utils.data import DataLoader, TensorDataset

from gpulse.channel.protocol import RECORD_FILE
from gpulse.report.records import ProfileRecord
from gpulse.schema import MAX_STRING_LEN
from gpulse.training import Run
from gpulse.training.errors import Guard
from gpulse.training.profiling import (
    PROFILE_ENV,
    PROFILES_DIR,
    PTRACE_ADVICE,
    Profile,
    ProfileWindow,
    child_pids,
    pyspy_dumps,
    pyspy_note,
    pyspy_text,
)
from gpulse.training.step import StepRecorder
from gpulse.training.trace_summary import load_trace, summarise

STEPS = 14
REQUEST_AT = 3


def train(run: Run, request: tuple[str, str] | None = None, steps: int = STEPS) -> list[bool]:
    """A loop whose slow operator is a large matmul; ``request`` is asked for, from another thread
    (as the background worker would), after step ``REQUEST_AT``. Returns what the request answered."""
    loader = DataLoader(TensorDataset(torch.randn(steps * 4, 64)), batch_size=4)
    big = torch.randn(384, 384)
    answers: list[bool] = []
    for i, (x,) in enumerate(run.wrap_loader(loader)):
        with run.step(samples=4):
            y = big @ big  # the slow operator
            (x.sum() + y.sum()).item()
        if request is not None and i == REQUEST_AT:
            t = threading.Thread(target=lambda: answers.append(run.profile_window.request(*request)))
            t.start()
            t.join()
    return answers


def run_in(tmp_path: Path, **kwargs) -> Run:
    return Run(name="prof", output_dir=tmp_path / "out", socket_path=str(tmp_path / "none.sock"), **kwargs)


def test_a_requested_window_saves_a_trace_that_names_the_slow_operator(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    assert train(run, ("data_loading", "data wait 40% of step time")) == [True]
    run.finish()
    traces = list((tmp_path / "out" / PROFILES_DIR).glob("*.json.gz"))
    assert len(traces) == 1
    with gzip.open(traces[0], "rt") as fh:  # gzip JSON, as Perfetto and HTA open it
        trace = json.load(fh)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert trace["gpulse"] == {"rule": "data_loading", "rank": 0}
    assert {"ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"} <= names
    report = json.loads((tmp_path / "out" / "metrics_report.json").read_text())
    [profile] = report["profiles"]
    assert profile["rule"] == "data_loading" and profile["path"] == str(traces[0])
    assert profile["steps"] == [REQUEST_AT + 4, REQUEST_AT + 5, REQUEST_AT + 6]
    summary = profile["summary"]
    assert summary["steps"] == 3
    assert summary["top_ops"][0]["name"] == "aten::mm"
    assert summary["top_ops"][0]["calls"] == 3
    assert summary["dataloader_wait_ms"] > 0 and summary["compute_ms"] > 0 and summary["comm_ms"] == 0
    # a data-loading finding also dumps the loader's stacks beside the trace, or says what would allow it
    if profile["pyspy_path"] is not None:
        assert Path(profile["pyspy_path"]).parent == traces[0].parent
        assert "Thread" in Path(profile["pyspy_path"]).read_text()
    else:
        assert PTRACE_ADVICE in profile["pyspy"]
    # the annotation: a train_event of kind profile naming the trace
    [event] = [e for e in run.report.events if e.get("kind") == "profile"]
    assert str(traces[0]) in event["text"] and "aten::mm" in event["text"]


def test_gpulse_report_shows_each_window_in_its_text_and_html(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """The window travels as the run's ``train_event`` point (here in the run's own recording: no
    agent), and ``gpulse report`` shows what it showed: the rule that asked for it, the steps it
    covered, the top operators by self time, communication vs compute, DataLoader wait, the py-spy
    dump's file or why there is none, and the trace's path."""
    run = run_in(tmp_path)
    train(run, ("data_loading", "data wait 40% of step time"))
    run.finish()
    [profile] = json.loads((tmp_path / "out" / "metrics_report.json").read_text())["profiles"]
    out = tmp_path / "report"
    cmd = gpulse_cmd("report", "--from-file", str(tmp_path / "out" / RECORD_FILE), "--out", str(out), "--html")
    done = subprocess.run(cmd, env=clean_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    s, first, last = profile["summary"], profile["steps"][0], profile["steps"][-1]
    top = s["top_ops"][0]
    dump = profile["pyspy_path"] or profile["pyspy"]
    shown = [
        ("asked for by", "data_loading: data wait 40% of step time"),
        ("steps", f"{first}-{last} (3 steps), {s['window_ms']:.1f} ms in all"),
        ("top operators by self time", f"aten::mm (cpu) {top['self_ms']:.2f} ms in 3 call(s)"),
        ("communication vs compute", f"{s['comm_ms']:.2f} ms vs {s['compute_ms']:.2f} ms"),
        ("DataLoader wait", f"{s['dataloader_wait_ms']:.2f} ms"),
        ("py-spy dump", dump),
        ("trace", profile["path"]),
    ]
    text = done.stdout
    assert "PROFILER WINDOWS: 1" in text and "[data_loading] rank 0" in text
    for label, value in shown:
        assert f"    {label}: {value}" in text, (label, value, text)
    page = (out / "metrics_report.html").read_text()
    assert "<h2>Profiler windows</h2>" in page
    for label, value in shown:
        assert f"<td>{escape(label)}</td>" in page and escape(value) in page, (label, value)
    # the report's JSON lists it as the run's own metrics_report.json does (the dump stays in its file)
    [again] = json.loads((out / "metrics_report.json").read_text())["profiles"]
    assert again == profile
    if profile["pyspy_path"] is not None:
        assert profile["pyspy"] is None


def test_a_window_with_long_names_still_fits_its_point_and_reads_back() -> None:
    """A point's string field is bounded: long operator names (CUDA kernels' are) and a long reason
    are cut, operators dropped from the end, and what is left is still a window the report reads."""
    summary = summarise(
        {"traceEvents": [
            {"ph": "X", "cat": "kernel", "name": f"k{i}" + "x" * 3000, "pid": 1, "tid": 1, "ts": i * 100, "dur": 90 - i}
            for i in range(5)
        ]}
    )  # fmt: skip
    profile = Profile("data_loading", "e" * 5000, 3, "/traces/t.pt.trace.json.gz", [7, 8, 9])
    profile.summary, profile.pyspy = summary, "why none " * 500
    text = profile.point_json()
    assert len(text) <= MAX_STRING_LEN
    record = ProfileRecord.from_json(json.loads(text))
    assert record is not None and record.summary is not None
    assert (record.rule, record.rank, record.steps, record.path) == ("data_loading", 3, [7, 8, 9], profile.path)
    assert 1 <= len(record.summary.top_ops) <= 5 and record.summary.top_ops[0].name.startswith("k0xxx")
    assert record.pyspy is not None and record.pyspy.startswith("why none")


def test_the_report_says_none_only_where_py_spy_took_no_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a ``pyspy_path`` the window's ``pyspy`` is why there is no dump, or the dump itself where
    its file could not be written: only the first is labelled "none"."""
    import shutil

    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    problems = pyspy_dumps(os.getpid())
    dumps = (['Process 12: python train.py\nThread 12 (idle): "MainThread"'], ["pid 13: py-spy dump failed: x"])

    def label(dumps: list[str], problems: list[str]) -> str:
        """What the reports show for a window whose dump's file could not be written (no ``pyspy_path``)."""
        profile = Profile("data_loading", "e", 0, "/traces/t.pt.trace.json.gz", [7, 8, 9])
        profile.pyspy = pyspy_note(dumps, problems, saved=False)
        record = ProfileRecord.from_json(json.loads(profile.point_json()))
        assert record is not None
        return dict(record.parts())["py-spy dump"]

    assert problems[0] == [] and label(*problems) == f"none: {pyspy_text(*problems)}"
    assert label(*dumps) == f"not saved to a file: {pyspy_text(*dumps)}"
    assert pyspy_note(*dumps, saved=True) == pyspy_text(*dumps)  # the point carries its path instead


def test_holistic_trace_analysis_reads_the_trace_and_finds_its_iterations(tmp_path: Path) -> None:
    from hta.trace_analysis import TraceAnalysis

    run = run_in(tmp_path)
    train(run, ("slow_step", "step time up 30%"))
    run.finish()
    analysis = TraceAnalysis(trace_dir=str(tmp_path / "out" / PROFILES_DIR))
    trace = analysis.t.get_trace(0)
    iterations = sorted(i for i in trace["iteration"].unique() if i >= 0)
    assert len(iterations) >= 2  # HTA drops the last ProfilerStep unless asked to keep it


def test_the_summary_counts_self_time_not_time_in_callees() -> None:
    """A parent spanning a child: the child's time is the child's, the parent keeps the rest."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 10, "dur": 70},
        {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": 1, "ts": 200, "dur": 50},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 300},
    ]
    s = summarise({"traceEvents": ev})
    assert [(o.name, o.self_ms) for o in s.top_ops] == [("inner", 0.07), ("gloo:all_reduce", 0.05), ("outer", 0.03)]
    assert (s.comm_ms, s.compute_ms, s.steps) == (0.05, 0.1, 1)


def test_a_rule_gets_one_window_an_hour_and_one_window_runs_at_a_time(tmp_path: Path) -> None:
    now = [1000.0]
    steps = StepRecorder(Guard())
    window = ProfileWindow(steps, Guard(), str(tmp_path), clock=lambda: now[0])
    assert window.request("data_loading", "first")
    assert not window.request("slow_step", "while one is pending")
    window._release()  # the window ended (as its reader does)
    assert not window.request("data_loading", "again within the hour")
    assert window.request("slow_step", "another rule")
    window._release()
    now[0] += 3600
    assert window.request("data_loading", "an hour later")


def test_a_full_profiles_directory_takes_no_window_and_says_so(tmp_path: Path) -> None:
    (tmp_path / PROFILES_DIR).mkdir()
    (tmp_path / PROFILES_DIR / "old.pt.trace.json.gz").write_bytes(b"x" * 1000)
    guard = Guard()
    window = ProfileWindow(StepRecorder(guard), guard, str(tmp_path), max_bytes=1000)
    assert not window.request("data_loading", "over the cap")
    assert guard.counts == {"profile_disk_cap": 1}
    assert ProfileWindow(StepRecorder(guard), guard, str(tmp_path), max_bytes=1001).request("data_loading", "")


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_profiling_switched_off_takes_no_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    if how == "environment":
        monkeypatch.setenv(PROFILE_ENV, "0")
    run = run_in(tmp_path, profile=how != "argument")
    assert train(run, ("data_loading", "refused")) == [False]
    run.finish()
    assert not (tmp_path / "out" / PROFILES_DIR).exists()
    assert json.loads((tmp_path / "out" / "metrics_report.json").read_text())["profiles"] == []


def test_a_healthy_run_takes_no_trace_and_adds_no_step_hook(tmp_path: Path) -> None:
    run = run_in(tmp_path)
    train(run)
    assert run.steps.step_end_hooks == []
    run.finish()
    assert not (tmp_path / "out" / PROFILES_DIR).exists()
    assert json.loads((tmp_path / "out" / "metrics_report.json").read_text())["profiles"] == []


def test_no_window_while_the_script_profiles_itself(tmp_path: Path) -> None:
    """A second profiler would end the script's own session: gpulse leaves it alone and says so."""
    run = run_in(tmp_path)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as own:
        assert train(run, ("slow_step", "asked while the user's profiler runs")) == [True]
    assert any(e.name == "aten::mm" for e in own.events())  # the script's profile is whole
    run.finish()
    assert run.stats()["steps_sent"] == STEPS
    assert run.guard.counts.get("profile_user_profiler") == 1
    assert not run.profile_window.busy and run.steps.step_end_hooks == []  # the next finding may ask again
    assert not (tmp_path / "out" / PROFILES_DIR).exists()


def test_py_spy_dumps_each_dataloader_worker(tmp_path: Path) -> None:
    """The workers are the training process's children; each gets one dump (as root here), or the
    text says what would let py-spy attach."""
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    workers = sorted(w.pid for w in it._workers)
    assert set(workers) <= set(child_pids(os.getpid()))
    dump = pyspy_text(*pyspy_dumps(os.getpid()))  # as the window makes its pyspy
    for pid in workers:
        assert f"Process {pid}:" in dump or f"pid {pid}: py-spy could not attach" in dump
    if os.geteuid() == 0:
        assert "_worker_loop" in dump  # torch/utils/data/_utils/worker.py, where a worker waits or loads
    del it


def test_a_trace_file_that_is_no_chrome_trace_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"events": []}')
    with pytest.raises(ValueError, match="no traceEvents"):
        load_trace(str(bad))


def dist_worker(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(512, 512))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        run = Run(name="ddp-prof", output_dir=out, socket_path=os.path.join(out, f"none{rank}.sock"))
        for i in range(10):
            with run.step(samples=4):
                model(torch.randn(4, 512)).square().mean().backward()  # the all-reduce runs here
                opt.step()
                opt.zero_grad()
            if i == 1:
                assert run.profile_window.request("straggler", f"rank {rank} asked")
        run.finish()
    finally:
        dist.destroy_process_group()


def test_each_rank_records_its_window_and_rank_0_reports_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distributed window: each trace carries torch's distributedInfo (its rank, for HTA), its
    summary counts gloo's time as communication, and rank 0's report lists both ranks' windows."""
    import torch.multiprocessing as mp

    for var in ("GPULSE_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "out"
    out.mkdir()
    mp.spawn(dist_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    profiles = json.loads((out / "metrics_report.json").read_text())["profiles"]
    assert sorted(p["rank"] for p in profiles) == [0, 1]
    for p in profiles:
        trace = load_trace(p["path"])
        assert trace["distributedInfo"]["rank"] == p["rank"] and trace["distributedInfo"]["backend"] == "gloo"
        assert p["summary"]["comm_ms"] > 0 and p["summary"]["compute_ms"] > 0
