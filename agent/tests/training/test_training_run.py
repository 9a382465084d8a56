"""``gpulse.training.Run`` in a plain PyTorch loop, talking to the real agent-side receiver."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from training_support import Agent, recorded, wait_for

from gpulse.channel.protocol import MAX_FIELDS, MAX_OPEN_FIELDS_PER_RUN, RECORD_FILE
from gpulse.training import Run

STEPS = 6


def slow_loader(n: int, delay: float):
    for _ in range(n):
        time.sleep(delay)
        yield torch.randn(8, 4), torch.randn(8, 1)


def train(run: Run, steps: int = STEPS, delay: float = 0.02) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(run.wrap_loader(slow_loader(steps, delay))):
        with run.step(samples=8, tokens=8 * 16):
            with run.phase("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with run.phase("backward"):
                loss.backward()
            with run.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            with run.phase("Grad Clip"):  # a custom phase; the name is normalised
                pass
        run.log(loss=loss.detach(), lr=0.1)  # a CPU tensor: read on the background thread
        if i == 2:
            run.mark("checkpoint", "ckpt-3")


@pytest.fixture
def agent(tmp_path: Path):
    a = Agent(tmp_path)
    yield a
    a.close()


def test_a_plain_loop_sends_every_step_with_plausible_fields(agent: Agent, tmp_path: Path) -> None:
    run = Run(name="plain", tags={"model": "linear"}, output_dir=tmp_path / "out", socket_path=agent.path)
    train(run)
    run.finish()
    steps = sorted(agent.points("train_step"), key=lambda p: p.fields["step"])
    assert [p.fields["step"] for p in steps] == list(range(1, STEPS + 1))
    for p in steps:
        f = p.fields
        assert p.tags == {
            "host": "testhost",
            "run": run.run_id,
            "rank": "0",
            "local_rank": "0",
            "world_size": "1",
            "model": "linear",
        }
        assert f["step_time_s"] > 0
        assert 0.015 < f["data_wait_s"] < 1.0  # the loader sleeps 20 ms per batch
        assert 0 < f["forward_s"] < f["step_time_s"]
        assert 0 < f["backward_s"] < f["step_time_s"]
        assert 0 < f["optimizer_s"] < f["step_time_s"]
        assert f["phase_grad_clip_s"] >= 0
        assert f["forward_s"] + f["backward_s"] + f["optimizer_s"] <= f["step_time_s"]
        assert f["end_time_ns"] - f["start_time_ns"] == pytest.approx(f["step_time_s"] * 1e9, abs=2)
        assert p.ts == f["end_time_ns"]
        assert f["samples"] == 8 and f["tokens"] == 128
        assert f["samples_per_s"] == pytest.approx(8 / f["step_time_s"])
        assert f["log_lr"] == 0.1 and f["log_loss"] > 0
        assert not any(k.endswith("_gpu_s") for k in f)  # no CUDA here: no GPU times, never zeros
        assert "mem_allocated_bytes" not in f
    runs = agent.points("train_run")
    assert [r.fields["event"] for r in runs] == ["start", "end"]
    end = runs[1].fields
    assert end["status"] == "finished" and end["steps"] == STEPS and end["duration_s"] > 0.1
    assert json.loads(end["config"])["gpulse"]["errors"] == {}
    events = agent.points("train_event")
    assert [(e.fields["kind"], e.fields["text"], e.fields["step"]) for e in events] == [("checkpoint", "ckpt-3", 3)]
    assert run.stats()["acked"] == STEPS + 3 and run.stats()["recorded"] == 0
    assert not (tmp_path / "out" / RECORD_FILE).exists()


def test_without_an_agent_every_step_lands_in_the_recording_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = Run(name="offline", output_dir=out, socket_path=str(tmp_path / "nobody" / "agent.sock"))
    train(run, delay=0.0)
    run.finish()
    steps = recorded(out / RECORD_FILE, "train_step")
    assert sorted(p.fields["step"] for p in steps) == list(range(1, STEPS + 1))
    assert {p.tags["host"] for p in steps} == {socket.gethostname()}
    assert {p.tags["run"] for p in steps} == {run.run_id}
    assert [p.fields["event"] for p in recorded(out / RECORD_FILE, "train_run")] == ["start", "end"]
    assert run.stats()["errors"] == {}  # an absent agent is expected, not an error


def test_an_agent_that_never_acks_is_given_up_after_ack_timeout(tmp_path: Path) -> None:
    """A socket that accepts datagrams but never answers stands in for a hung agent."""
    path = str(tmp_path / "hung.sock")
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    hung.bind(path)
    out = tmp_path / "out"
    try:
        run = Run(name="hung", output_dir=out, socket_path=path, ack_timeout=0.3)
        train(run, steps=3, delay=0.0)
        assert wait_for(lambda: run.stats()["recorded"] >= 1, timeout=5)  # before finish: timeout, not close
        run.finish()
    finally:
        hung.close()
    assert sorted(p.fields["step"] for p in recorded(out / RECORD_FILE, "train_step")) == [1, 2, 3]
    assert run.stats()["errors"]["agent_unavailable"] >= 1


def test_when_the_agent_dies_mid_run_every_step_is_in_the_agent_or_the_file(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    out = tmp_path / "out"
    run = Run(name="killed", output_dir=out, socket_path=agent.path, ack_timeout=0.5)
    try:
        for i in range(20):
            with run.step(samples=1):
                pass
            if i == 9:
                assert wait_for(lambda: run.stats()["acked"] >= 5)
                agent.close()  # the agent goes away; its socket file with it
        run.finish()
    finally:
        agent.close()
    delivered = {p.fields["step"] for p in agent.points("train_step")}
    filed = {p.fields["step"] for p in recorded(out / RECORD_FILE, "train_step")}
    assert delivered and filed
    assert delivered | filed == set(range(1, 21))
    # Recorded points carry the agent's host tag (learnt from its acks), not this machine's
    # hostname: an upload then overwrites the same series instead of duplicating them.
    assert {p.tags["host"] for p in recorded(out / RECORD_FILE)} == {"testhost"} != {socket.gethostname()}


def test_the_unacknowledged_buffer_is_bounded_and_spills_to_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "hung.sock")
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    hung.bind(path)
    out = tmp_path / "out"
    try:
        run = Run(name="bounded", output_dir=out, socket_path=path, ack_timeout=60, max_unacked=5)
        for _ in range(40):
            with run.step(samples=1):
                pass
        assert wait_for(lambda: run.stats()["recorded"] >= 30)
        assert run.stats()["pending"] <= 5
        run.finish()
    finally:
        hung.close()
    assert len(recorded(out / RECORD_FILE, "train_step")) == 40


def test_the_hot_path_never_synchronises_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU torch cannot run ``set_sync_debug_mode``; instead every way to wait for the GPU raises."""

    def forbidden(*a, **k):
        raise AssertionError("gpulse waited for the GPU")

    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", forbidden)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", forbidden)
    run = Run(name="nosync", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"))
    train(run, steps=3, delay=0.0)
    run.finish()
    assert run.stats()["errors"] == {}
    assert len(recorded(tmp_path / RECORD_FILE, "train_step")) == 3


def test_errors_inside_gpulse_never_reach_the_loop(tmp_path: Path) -> None:
    run = Run(name="robust", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"))
    for _ in range(3):
        with run.step(samples=2):
            pass
        run.log(loss=float("nan"), bad=object(), vec=torch.ones(3))  # unloggable values
    run.finish()
    run.finish()  # idempotent
    errors = run.stats()["errors"]
    assert errors["log_value"] == 3 and errors["log_not_scalar"] == 3
    steps = recorded(tmp_path / RECORD_FILE, "train_step")
    assert len(steps) == 3 and not any(k.startswith("log_") for p in steps for k in p.fields)


def test_an_exception_in_a_step_is_not_counted_and_an_oom_is_marked(tmp_path: Path) -> None:
    run = Run(name="oom", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"))
    with run.step():
        pass
    with pytest.raises(torch.OutOfMemoryError):
        with run.step():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with run.step():
        pass
    run.finish("failed")
    assert [p.fields["step"] for p in recorded(tmp_path / RECORD_FILE, "train_step")] == [1, 2]
    (oom,) = recorded(tmp_path / RECORD_FILE, "train_event")
    assert oom.fields["kind"] == "oom" and "Tried to allocate" in oom.fields["text"]
    assert recorded(tmp_path / RECORD_FILE, "train_run")[-1].fields["status"] == "failed"


def test_a_run_used_as_context_manager_records_the_failure(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with Run(name="ctx", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock")) as run:
            with run.step():
                pass
            raise RuntimeError("boom")
    assert recorded(tmp_path / RECORD_FILE, "train_run")[-1].fields["status"] == "failed"


def test_finish_writes_the_metrics_report(agent: Agent, tmp_path: Path) -> None:
    run = Run(name="report", output_dir=tmp_path / "out", socket_path=agent.path)
    train(run)
    run.finish()
    report = json.loads((tmp_path / "out" / "metrics_report.json").read_text())
    assert run.stats()["errors"] == {}
    assert report["run"]["id"] == run.run_id and report["run"]["status"] == "finished"
    assert report["train_steps"] == STEPS and report["train_samples"] == 8 * STEPS
    assert report["data_loading_time_ratio"] > 0.15  # the loader sleeps 20 ms; steps take ~1 ms
    assert "data_loading" in [finding["id"] for finding in report["diagnosis"]]


def test_the_run_id_comes_from_the_launcher_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULSE_RUN_ID", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's placeholder is ignored
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    run = Run(output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False)
    run.finish()
    assert run.run_id == "slurm-4242.0"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-7")
    run = Run(output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False)
    run.finish()
    assert run.run_id == "elastic-7"


def test_a_generated_run_id_is_passed_to_child_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPULSE_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    run = Run(name="parent", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False)
    run.finish()
    assert run.run_id.startswith("parent-")
    child = subprocess.run(
        [sys.executable, "-c", "from gpulse.training.identity import env_run_id; print(env_run_id())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == run.run_id


def test_user_tags_are_capped_and_reserved_names_refused(tmp_path: Path) -> None:
    tags = {f"t{i}": i for i in range(10)} | {"rank": "7", "bad key": "x"}
    run = Run(tags=tags, output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False)
    run.finish()
    assert {k: v for k, v in run.tags.items() if k.startswith("t")} == {f"t{i}": str(i) for i in range(8)}
    assert run.tags["rank"] == "0"
    assert set(run.stats()["errors"]) == {"too_many_tags", "bad_tag"}


def test_importing_the_library_imports_only_the_standard_library() -> None:
    code = (
        "import sys, time; t = time.perf_counter(); import gpulse.training; dt = time.perf_counter() - t\n"
        "heavy = [m for m in ('torch', 'numpy', 'influxdb_client', 'gpulse.lineprotocol.encode', 'transformers') if m in sys.modules]\n"
        "print(heavy, dt)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "[]"


def test_creating_a_run_does_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from gpulse.training import Run\n"
        f"r = Run(output_dir={str(tmp_path)!r}, socket_path={str(tmp_path / 'x.sock')!r})\n"
        "with r.step(samples=1): pass\n"
        "r.finish(); print('torch' in sys.modules, 'influxdb_client' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_the_steps_kept_for_the_report_are_bounded_and_evenly_thinned(tmp_path: Path) -> None:
    run = Run(output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), max_report_steps=4, write_report=False)
    for _ in range(9):
        with run.step():
            pass
    run.finish()
    assert [s["step"] for s in run.report.steps] == [1, 5, 9]
    assert {s["run"] for s in run.report.steps} == {run.run_id}


def test_the_runs_totals_count_every_step_also_those_thinned_out_of_the_report(tmp_path: Path) -> None:
    run = Run(output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), max_report_steps=4, write_report=False)
    for i in range(9):
        with run.step(samples=i + 1, tokens=10 * (i + 1)):
            pass
    run.finish()
    assert len(run.report.steps) == 3
    (end,) = [p.fields for p in recorded(tmp_path / RECORD_FILE, "train_run") if p.fields["event"] == "end"]
    assert (end["samples"], end["tokens"]) == (45, 450)


def test_the_recording_and_the_report_are_private_files(agent: Agent, tmp_path: Path) -> None:
    """Run data is the user's: 0600 like the agent's own files, also where an older file was 0644."""
    out = tmp_path / "out"
    out.mkdir()
    (out / RECORD_FILE).write_text("")
    os.chmod(out / RECORD_FILE, 0o644)
    old = os.umask(0o022)
    try:
        run = Run(name="private", output_dir=out, socket_path=str(tmp_path / "none.sock"))
        train(run, steps=2, delay=0.0)
        run.finish()
    finally:
        os.umask(old)
    assert stat.S_IMODE((out / RECORD_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "metrics_report.json").stat().st_mode) == 0o600
    assert len(recorded(out / RECORD_FILE, "train_step")) == 2
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []


def test_a_step_with_more_scalars_than_the_agent_takes_in_a_point_is_recorded_not_lost(
    agent: Agent, tmp_path: Path
) -> None:
    """The agent refuses a point of more than ``MAX_FIELDS`` fields; such a step goes to the file, said once."""
    run = Run(name="wide", output_dir=tmp_path / "out", socket_path=agent.path, write_report=False)
    for step in range(3):
        with run.step():
            pass
        run.log(**({f"grad_norm_layer{i}": 1.0 for i in range(MAX_FIELDS)} if step == 1 else {}), loss=0.5)
    run.finish()
    assert sorted(p.fields["step"] for p in agent.points("train_step")) == [1, 3]
    (wide,) = recorded(tmp_path / "out" / RECORD_FILE, "train_step")
    assert wide.fields["step"] == 2 and len([k for k in wide.fields if k.startswith("log_")]) == MAX_FIELDS + 1
    assert run.stats()["errors"]["oversize_message"] == 1


def test_a_run_logging_thousands_of_distinct_scalars_is_told_and_kept_within_the_limit(tmp_path: Path) -> None:
    run = Run(name="many", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False)
    for step in range(3):
        with run.step():
            pass
        run.log(**{f"grad_norm_layer{i}": 1.0 for i in range(step * 400, step * 400 + 400)}, loss=0.5)
    run.finish()
    names = {k for p in recorded(tmp_path / RECORD_FILE, "train_step") for k in p.fields if k.startswith("log_")}
    assert len(names) == MAX_OPEN_FIELDS_PER_RUN and "log_loss" in names
    assert run.stats()["errors"]["too_many_open_fields"] == 3 * 400 + 1 - MAX_OPEN_FIELDS_PER_RUN  # one per value


def test_communication_or_memory_given_by_hand_is_in_the_steps_after_it(tmp_path: Path) -> None:
    """A plain step checks one flag for what integrations add; ``add_comm`` sets it, and so does an
    allocator probe (each in a run of its own: the flag, once set, stays)."""

    class Probe:
        def read(self) -> tuple[int, int, int, int]:
            return (1000, 2000, 4096, 0)

    def fields(out: Path, name: str) -> list[object]:
        steps = sorted(recorded(out / RECORD_FILE, "train_step"), key=lambda p: p.fields["step"])
        return [p.fields.get(name) for p in steps]

    for out, by_hand in ((tmp_path / "comm", "comm"), (tmp_path / "memory", "memory")):
        run = Run(output_dir=out, socket_path=str(tmp_path / "none.sock"), write_report=False)
        with run.step():
            pass
        with run.step():
            if by_hand == "comm":
                run.add_comm(2_000_000)
            else:
                run.steps.memory = Probe()
        with run.step():
            pass
        run.finish()
    assert fields(tmp_path / "comm", "comm_s") == [None, 0.002, 0.0]  # measured from then on: 0 is a value
    assert fields(tmp_path / "memory", "mem_reserved_bytes") == [None, 2000, 2000]


def test_the_steps_kept_for_the_report_leave_no_object_the_garbage_collector_tracks(tmp_path: Path) -> None:
    """A (shape, row) pair per kept step stayed tracked for the run's life: promoted to the oldest
    generation, 10 000 of them brought on full collections, tens of ms each with torch in the heap."""
    import gc

    def tracked_after(steps: int) -> int:
        gc.collect()  # what an earlier run left
        before = len(gc.get_objects())
        run = Run(output_dir=tmp_path / str(steps), socket_path=str(tmp_path / "none.sock"), write_report=False)
        for _ in range(steps):
            with run.step(samples=2):
                with run.phase("forward"):
                    pass
            run.log(loss=0.5)
        run.finish()
        assert len(run.report.steps) == steps  # all kept (max_report_steps 10 000)
        gc.collect()
        return len(gc.get_objects()) - before

    tracked_after(10)  # what a first run imports
    assert tracked_after(2000) - tracked_after(200) < 100
