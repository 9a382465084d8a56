"""GPU phase times, memory counters and GPU registration, against a faithful fake of the CUDA boundary.

There is no GPU in CI. ``FakeTorch`` stands in for the few ``torch.cuda`` calls gpulse makes, with
the semantics of the real ones (``c10/cuda/CUDAEvent.h``): ``Event.record()`` is asynchronous;
``query()`` is true only once the (fake) GPU has passed the event; ``elapsed_time()`` raises unless
both events have completed; ``synchronize()`` would block. The allocator counters have the nested
shape of ``torch._C._cuda_memoryStats``; a one-element CUDA tensor copied with ``non_blocking``
holds garbage until its event completes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import patch

import pytest
from training_support import Agent, recorded, wait_for

from gpulse.channel.protocol import RECORD_FILE
from gpulse.training import Run

UUID = "6f1b1a2e-1c3d-4e5f-8a9b-0c1d2e3f4a5b"


class FakeGPU:
    def __init__(self) -> None:
        self.recorded = 0  # events recorded so far (stream position)
        self.done = 0  # the GPU has executed everything up to this position
        self.early_reads = 0
        self.syncs = 0
        self.peak_resets = 0
        self.allocated = 1000

    def finish_all(self) -> None:
        self.done = self.recorded


def make_fake_torch(gpu: FakeGPU) -> SimpleNamespace:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.pos = None
            self.at = 0.0

        def record(self, stream=None) -> None:
            gpu.recorded += 1
            self.pos = gpu.recorded
            self.at = time.perf_counter()

        def query(self) -> bool:
            return self.pos is not None and self.pos <= gpu.done

        def elapsed_time(self, end: Event) -> float:
            if not (self.query() and end.query()):
                gpu.early_reads += 1
                raise RuntimeError("Both events must be completed before calculating elapsed time.")
            return (end.at - self.at) * 1000.0

        def synchronize(self) -> None:
            gpu.syncs += 1

    def memory_stats(device: int) -> dict:
        gpu.allocated += 10
        return {
            "allocated_bytes": {"all": {"current": gpu.allocated, "peak": gpu.allocated + 500}},
            "reserved_bytes": {"all": {"current": 4096}},
            "num_alloc_retries": 2,
        }

    def reset_peak(device: int) -> None:
        gpu.peak_resets += 1

    props = SimpleNamespace(uuid=UUID, name="NVIDIA H100 80GB HBM3")
    cuda = SimpleNamespace(
        is_initialized=lambda: True,
        current_device=lambda: 0,
        Event=Event,
        memory_stats=None,
        reset_peak_memory_stats=reset_peak,
        device_count=lambda: 1,
        memory_reserved=lambda i: 4096,
        get_device_properties=lambda i: props,
        synchronize=lambda *a: setattr(gpu, "syncs", gpu.syncs + 1),
    )
    return SimpleNamespace(
        cuda=cuda, _C=SimpleNamespace(_cuda_memoryStats=memory_stats, _cuda_resetPeakMemoryStats=reset_peak)
    )


class PinnedCopy:
    def __init__(self, gpu: FakeGPU, value: float) -> None:
        self.gpu, self.value, self.pos = gpu, value, gpu.recorded + 1  # the event recorded right after

    def __float__(self) -> float:
        if self.pos > self.gpu.done:
            self.gpu.early_reads += 1
            return float("nan")  # what an unfinished pinned buffer may hold
        return self.value


class CudaScalar:
    """A one-element CUDA tensor (e.g. the loss) as far as gpulse touches it."""

    device = SimpleNamespace(type="cuda")

    def __init__(self, gpu: FakeGPU, value: float) -> None:
        self.gpu, self.value = gpu, value

    def numel(self) -> int:
        return 1

    def detach(self) -> CudaScalar:
        return self

    def to(self, device: str, non_blocking: bool = False) -> PinnedCopy:
        assert device == "cpu" and non_blocking
        return PinnedCopy(self.gpu, self.value)

    def item(self) -> float:
        raise AssertionError(".item() synchronises")


def gpu_run(tmp_path: Path, gpu: FakeGPU, socket_path: str, **kw) -> Run:
    """A run in a process whose script has initialised CUDA: the run finds it as it finds the real
    one, by looking for ``torch`` in ``sys.modules`` (gpulse never imports it)."""
    with patch.dict(sys.modules, {"torch": make_fake_torch(gpu)}):
        run = Run(name="gpu", output_dir=tmp_path, socket_path=socket_path, **kw)
    assert run.steps.cuda.device == 0
    return run


def one_step(run: Run, gpu: FakeGPU, loss: float) -> None:
    with run.step(samples=4, tokens=4096):
        with run.phase("forward"):
            time.sleep(0.002)
        with run.phase("backward"):
            pass
        with run.phase("optimizer"):
            pass
    run.log(loss=CudaScalar(gpu, loss))


def test_gpu_times_are_read_only_after_the_gpu_passed_the_events(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    gpu = FakeGPU()
    try:
        run = gpu_run(tmp_path, gpu, agent.path, peak_flops=None, flops_per_token=1e6)
        for i in range(3):
            one_step(run, gpu, loss=1.0 + i)
        with run.step(samples=4, tokens=4096):  # hands the third step (and its loss) over
            pass
        time.sleep(0.3)
        assert run.steps_sent == 0  # the GPU is behind: steps wait, nothing blocks
        gpu.finish_all()
        assert wait_for(lambda: run.steps_sent == 3)
        gpu.finish_all()
        run.finish()
        assert (gpu.early_reads, gpu.syncs) == (0, 0)
        steps = sorted(agent.points("train_step"), key=lambda p: p.fields["step"])
        assert [p.fields["step"] for p in steps] == [1, 2, 3, 4]
        for p in steps[:3]:
            f = p.fields
            assert 0.0015 < f["forward_gpu_s"] < f["step_time_s"]
            assert f["backward_gpu_s"] >= 0 and f["optimizer_gpu_s"] >= 0
            assert f["mem_peak_bytes"] == f["mem_allocated_bytes"] + 500 and f["mem_reserved_bytes"] == 4096
            assert f["alloc_retries"] == 2
            assert f["mfu"] == pytest.approx(1e6 * 4096 / f["step_time_s"] / 989e12)  # H100 SXM bf16 peak
        assert [p.fields["log_loss"] for p in steps[:3]] == [1.0, 2.0, 3.0]
        assert gpu.peak_resets == 4  # once per step
        assert agent.receiver.gpu_runs() == {}  # unregistered at finish
        end = agent.points("train_run")[-1].fields
        assert end["gpus"] == f"GPU-{UUID}" and end["peak_flops"] == 989e12
        assert run.stats()["errors"] == {}
    finally:
        agent.close()


def test_the_gpu_is_registered_with_the_agent_while_the_run_lasts(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    gpu = FakeGPU()
    try:
        run = gpu_run(tmp_path, gpu, agent.path)
        assert wait_for(lambda: agent.receiver.gpu_runs() == {f"GPU-{UUID}": run.run_id})
        run.finish()
        assert wait_for(lambda: agent.receiver.gpu_runs() == {})
    finally:
        agent.close()


def test_steps_whose_events_never_complete_are_sent_without_gpu_times(tmp_path: Path) -> None:
    gpu = FakeGPU()
    run = gpu_run(tmp_path, gpu, str(tmp_path / "none.sock"))
    for i in range(3):
        one_step(run, gpu, loss=float(i))
    run.finish()  # the GPU never catches up: finish gives up after a bound instead of waiting
    assert (gpu.early_reads, gpu.syncs) == (0, 0)
    steps = recorded(tmp_path / RECORD_FILE, "train_step")
    assert sorted(p.fields["step"] for p in steps) == [1, 2, 3]
    assert not any(k.endswith("_gpu_s") or k == "log_loss" for p in steps for k in p.fields)
    assert run.stats()["errors"]["gpu_times_dropped"] == 3


def test_the_event_pool_is_bounded(tmp_path: Path) -> None:
    gpu = FakeGPU()
    run = gpu_run(tmp_path, gpu, str(tmp_path / "none.sock"))
    run.steps.timer.capacity = 6  # room for one step's three phases
    for _ in range(3):
        with run.step():
            for name in ("forward", "backward", "optimizer"):
                with run.phase(name):
                    pass
    assert gpu.recorded == 6 and run.steps.timer.exhausted > 0
    gpu.finish_all()
    run.finish()
    steps = sorted(recorded(tmp_path / RECORD_FILE, "train_step"), key=lambda p: p.fields["step"])
    assert "forward_gpu_s" in steps[0].fields
    assert all("forward_gpu_s" not in p.fields for p in steps[1:])
    assert [p.fields["step"] for p in steps] == [1, 2, 3]


def test_a_run_created_after_cuda_was_initialised_times_the_gpu_from_the_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpulse never imports torch: it finds the training script's, already initialised, in ``sys.modules``."""
    gpu = FakeGPU()
    monkeypatch.setitem(sys.modules, "torch", make_fake_torch(gpu))
    run = Run(name="found", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False)
    one_step(run, gpu, loss=1.5)
    with run.step():  # hands the first step (and the copy of its loss) over
        pass
    gpu.finish_all()
    run.finish()
    step = min(recorded(tmp_path / RECORD_FILE, "train_step"), key=lambda p: p.fields["step"])
    assert step.fields["forward_gpu_s"] > 0 and step.fields["log_loss"] == 1.5 and "mem_peak_bytes" in step.fields
    assert recorded(tmp_path / RECORD_FILE, "train_run")[-1].fields["gpus"] == f"GPU-{UUID}"


def test_phases_timed_before_cuda_was_initialised_time_the_gpu_once_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual order: the first steps run before the script's torch initialised CUDA (phases made
    on the CPU path), and detection (at step 16) finds it later: the same phases then record events."""
    gpu = FakeGPU()
    run = Run(name="late", output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False)
    for _ in range(3):
        one_step_cpu(run)
    monkeypatch.setitem(sys.modules, "torch", make_fake_torch(gpu))  # CUDA initialised now
    for _ in range(16):
        one_step_cpu(run)
    assert gpu.recorded > 0  # found at the next check, and the phases made before record events
    gpu.finish_all()
    run.finish()
    steps = sorted(recorded(tmp_path / RECORD_FILE, "train_step"), key=lambda p: p.fields["step"])
    assert len(steps) == 19
    assert not any("forward_gpu_s" in p.fields for p in steps[:3])
    assert all(p.fields["forward_gpu_s"] >= 0 and "backward_gpu_s" in p.fields for p in steps[-3:])
    assert (gpu.early_reads, gpu.syncs) == (0, 0)


def one_step_cpu(run: Run) -> None:
    with run.step(samples=4):
        for name in ("forward", "backward", "optimizer"):
            with run.phase(name):
                pass
