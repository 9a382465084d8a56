"""Communication time per step from a DDP comm hook (``comm_s``).

``attach_ddp(run, ddp_model)`` wraps the gradient all-reduce hook (by default PyTorch's own
``allreduce_hook``) and measures each bucket from the moment the hook issues it until its future
completes:

* on CPU (gloo) the future completes when the collective has finished, so host timestamps are
  exact; overlapping buckets are merged (union of intervals), so ``comm_s`` is wall time during
  which at least one all-reduce was in flight;
* on CUDA (NCCL) a future "completes" as soon as the kernel is enqueued, so host time would be
  wrong; instead a CUDA event is recorded when the first bucket is issued and one in the future's
  callback (which runs on a stream ordered after the all-reduce), and the span is read like the
  phase events, only once complete. ``comm_s`` is then the GPU span from the first bucket's issue
  to the last bucket's completion (an upper bound of exposed communication).
"""

from __future__ import annotations

import threading
from time import perf_counter_ns
from typing import Any

COMM_PHASE = "comm"


class _HostIntervals:
    """Union of [start, end] intervals in ns, folded into the run at each step end."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.lock = threading.Lock()  # callbacks run on gloo / autograd threads
        self.start = 0
        self.end = 0
        self.total = 0

    def add(self, t0: int, t1: int) -> None:
        with self.lock:
            if self.end and t0 <= self.end:  # overlaps the open interval: extend it
                if t1 > self.end:
                    self.end = t1
                if t0 < self.start:
                    self.start = t0
                return
            if self.end:
                self.total += self.end - self.start
            self.start, self.end = t0, t1
            self.flush_into_run()

    def flush_into_run(self) -> None:
        if self.total:
            self.run.add_comm(self.total)
            self.total = 0

    def close_step(self) -> None:
        with self.lock:
            if self.end:
                self.total += self.end - self.start
                self.start = self.end = 0
            self.flush_into_run()


class _CudaSpan:
    """First-issue and last-completion CUDA events of a step's buckets, handed to the run as a pair."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.lock = threading.Lock()
        self.first: Any = None
        self.last: Any = None

    def begin(self) -> None:
        timer = self.run.steps.timer
        if timer is None:
            return
        with self.lock:
            if self.first is None:
                self.first = timer.record()

    def end(self) -> None:
        timer = self.run.steps.timer
        if timer is None:
            return
        ev = timer.record()
        with self.lock:
            if self.last is not None:
                timer.release(self.last)
            self.last = ev

    def close_step(self) -> None:
        with self.lock:
            first, last = self.first, self.last
            self.first = self.last = None
        pairs = self.run.steps.pairs
        if first is not None and last is not None and pairs is not None:
            pairs.append((COMM_PHASE, first, last))
        else:
            self.run.steps.cuda.release(first, last)


def attach_ddp(run: Any, ddp_model: Any, hook: Any = None, state: Any = None) -> bool:
    """Time ``ddp_model``'s gradient communication into ``run`` (call once, before training).

    ``hook``/``state`` are the comm hook you would otherwise register (default: PyTorch's
    ``allreduce_hook`` with the default process group); gpulse wraps it and registers the wrapper.
    Returns ``False`` (and reports once) if the hook could not be registered; training is unaffected.
    """
    try:
        _attach(run, ddp_model, hook, state)
        return True
    except Exception as exc:
        run.guard.report("comm_hook", exc, "comm_s not measured")
        return False


def _attach(run: Any, ddp_model: Any, hook: Any, state: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    inner = hook or default_hooks.allreduce_hook
    cuda = next(ddp_model.parameters()).is_cuda
    host = _HostIntervals(run)
    span = _CudaSpan(run)
    guard = run.guard

    def timed_hook(hook_state: Any, bucket: Any) -> Any:
        t0 = perf_counter_ns()
        if cuda:
            try:
                span.begin()
            except Exception as exc:
                guard.report("comm_event", exc)
        fut = inner(hook_state, bucket)

        def done(f: Any) -> Any:
            try:
                if cuda:
                    span.end()
                else:
                    host.add(t0, perf_counter_ns())
            except Exception as exc:
                guard.report("comm_timing", exc)
            return f.value()

        return fut.then(done)

    # DDP checks the hook's annotations as objects (this module's are strings under PEP 563)
    timed_hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    ddp_model.register_comm_hook(state, timed_hook)
    run.steps.on_step_end(span.close_step if cuda else host.close_step)
