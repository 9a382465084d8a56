"""Communication per step: how long the training thread waited for it, and how long it was in flight.

Two ``train_step`` fields:

* ``comm_s``, the **exposed** communication: from the end of backward's compute (the last gradient
  accumulated) to the end of the backward call. With DDP that is when every bucket's all-reduce
  is done: DDP's reducer waits for them (and copies the result back) in an autograd final callback
  before ``backward()`` returns. On a rank that reached the all-reduce before the others, it
  includes the wait for the slower ranks; the report tells the two apart across ranks
  (:mod:`gpulse.report.model`).
* ``comm_in_flight_s``: time any collective was in flight or waited for, the union of each DDP
  bucket's [issue, completion] and the exposed wait. Communication that overlaps backward's
  compute is in flight but not exposed.

On a GPU, NCCL runs beside compute and the exposed wait is what communication costs the step. On
a CPU (gloo), collectives take cores from backward too: the cost lies between the two figures.

How, never waiting for the device:

* the **wait probe** (:class:`WaitProbe`) needs only the parameters, no comm hook: a
  post-accumulate-grad hook notes when gradients are ready; the first one of a backward queues an
  autograd final callback, and that callback queues a second one, which therefore runs after every
  final callback queued during the backward (DDP's wait is one of them; FSDP's too). The first
  backward hooks every parameter to learn which gradient is accumulated last; after it only the
  first and the last parameter keep their hook. On CPU it reads the host clock; on CUDA it records
  two events on the backward's stream (the second is ordered after the wait, as DDP makes the
  current stream wait for the all-reduce), read later by the worker like phase events.
* the **comm hook** (:func:`attach_ddp`) wraps DDP's all-reduce hook: on CPU each bucket counts
  from its issue until its future completes (gloo completes it when the collective has finished);
  on CUDA the in-flight time is the span from the first bucket's issue to the end of the wait (an
  upper bound: a CUDA future "completes" when the kernel is queued).

Where the model comes from: :func:`attach_ddp` (the user), the HF and Lightning callbacks (they
find the wrapped model, :func:`attach_model`), ``Run(model=...)``, and otherwise, in a distributed
run, the first ``step()`` of any ``torch.optim`` optimizer (a global step pre-hook, removed once
used) hands its parameters to the wait probe. So the exposed wait and straggler detection need no
code; the time in flight needs the DDP module.

Limits: FSDP2 (``fully_shard``) waits for its collectives inside forward and backward, layer by
layer: only the wait at the end of backward is seen, the rest counts as compute.
A model whose gradients come in a different order from one backward to the next (a dynamic graph)
may have its wait measured from a gradient before the last one.
"""

from __future__ import annotations

import functools
import sys
import threading
from time import perf_counter_ns
from typing import Any

COMM_PHASE = "comm"
IN_FLIGHT_PHASE = "comm_in_flight"


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of ``[start, end]`` intervals."""
    total = 0
    start = end = None
    for a, b in sorted(intervals):
        if end is None or a > end:
            if end is not None:
                total += end - start  # type: ignore[operator]
            start, end = a, b
        elif b > end:
            end = b
    return total + (end - start if end is not None else 0)  # type: ignore[operator]


class CommTimer:
    """One run's communication timing: the wait probe and the comm hook report here; each step end
    folds the step's intervals into its record. ``run.comm_timer``; made by :func:`comm_timer`."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.steps = run.steps
        self.guard = run.guard
        self.lock = threading.Lock()  # bucket callbacks run on gloo threads
        #: host intervals of the open step (bucket issue → completion, and the exposed waits)
        self.intervals: list[tuple[int, int]] = []
        self.probe: WaitProbe | None = None
        #: a comm hook times the buckets: the time in flight is known
        self.hooked = False
        #: CUDA event of the first bucket issued in the current backward (comm hook on CUDA)
        self.first_issue: Any = None
        self._optimizer_hook: Any = None
        self.closed = False
        self.steps.on_step_end(self.close_step)

    # -- what the probe and the hook hand in ---------------------------------------------------------
    def add_interval(self, t0: int, t1: int) -> None:
        if self.closed:  # DDP keeps the comm hook after the run: nothing may pile up here
            return
        with self.lock:
            self.intervals.append((t0, t1))

    def add_wait(self, t0: int, t1: int) -> None:
        """An exposed wait measured on the host (CPU)."""
        if self.closed:
            return
        self.steps.add_comm(t1 - t0)
        if self.hooked:
            self.add_interval(t0, t1)

    def add_gpu_wait(self, start: Any, end: Any, in_flight_end: Any) -> None:
        """An exposed wait as CUDA events; with the comm hook also the in-flight span (CUDA)."""
        first, self.first_issue = self.first_issue, None
        pairs = self.steps.pairs
        if pairs is None:  # no step open: nothing to hand the events to
            self.steps.cuda.release(start, end, first, in_flight_end)
            return
        pairs.append((COMM_PHASE, start, end))
        if first is not None and in_flight_end is not None:
            pairs.append((IN_FLIGHT_PHASE, first, in_flight_end))
        else:
            self.steps.cuda.release(first, in_flight_end)

    def issued_on_cuda(self) -> None:
        if self.first_issue is None and not self.closed:
            self.first_issue = self.steps.record_event() if self.steps.timer is not None else None

    def close_step(self) -> None:
        """At each step end: the step's time in flight (union of its intervals)."""
        if self.probe is not None:
            self.probe.queued = False  # a backward that raised must not keep the next ones unmeasured
        if not self.intervals:
            return
        with self.lock:
            intervals, self.intervals = self.intervals, []
        if self.hooked:
            self.steps.add_comm_in_flight(union_ns(intervals))

    # -- finding what to time -------------------------------------------------------------------------
    def watch(self, params: Any) -> bool:
        """Put the wait probe on ``params`` (once per run); whether the run has a probe now."""
        if self.probe is None:
            try:
                self.probe = WaitProbe(self, params)
            except Exception as exc:
                self.guard.report("comm_probe", exc, "comm_s not measured")
                return False
            self.forget_optimizers()
        return True

    def watch_first_optimizer(self) -> None:
        """Until something else gives the parameters: take those of the first ``torch.optim`` step."""
        if self.probe is not None or self._optimizer_hook is not None:
            return
        optim = sys.modules.get("torch.optim.optimizer")
        if optim is None:  # torch not imported (yet): the step ends try again
            return
        self._optimizer_hook = optim.register_optimizer_step_pre_hook(self._first_step)

    def _first_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self.watch([p for group in optimizer.param_groups for p in group["params"]])
        except Exception as exc:
            self.guard.report("comm_probe", exc, "comm_s not measured")
        finally:
            self.forget_optimizers()

    def forget_optimizers(self) -> None:
        hook, self._optimizer_hook = self._optimizer_hook, None
        if hook is not None:
            hook.remove()

    def close(self) -> None:
        """The run finished: take the hooks off (a comm hook cannot be taken off DDP: it is muted)."""
        self.closed = True
        self.forget_optimizers()
        if self.probe is not None:
            self.probe.remove()
        self.intervals = []


class WaitProbe:
    """The exposed wait of every backward, from parameter hooks and autograd final callbacks."""

    def __init__(self, timer: CommTimer, params: Any) -> None:
        import torch

        self.timer = timer
        self.guard = timer.guard
        self.steps = timer.steps
        self.engine = torch.autograd.Variable._execution_engine
        params = [p for p in params if getattr(p, "requires_grad", False)]
        if not params:
            raise ValueError("no parameter that requires grad")
        self.cuda = bool(params[0].is_cuda)
        #: a final callback is queued for the backward in progress
        self.queued = False
        self.t_ready = 0
        self.t_graph = 0
        self.ev_ready: Any = None
        #: while learning (the first backward): parameter indices in the order their gradients came
        self.order: list[int] | None = []
        self.last = -1
        self.last_seen = False
        self.handles = [p.register_post_accumulate_grad_hook(functools.partial(self._ready, i)) for i, p in enumerate(params)]  # fmt: skip

    def _ready(self, index: int, param: Any) -> None:
        """A gradient was accumulated (autograd thread)."""
        try:
            if self.order is not None or index == self.last:
                self.t_ready = perf_counter_ns()
                self.last_seen = True
                if self.cuda:
                    self._record_ready()
                if self.order is not None:
                    self.order.append(index)
            if not self.queued:
                self.queued = True
                self.engine.queue_callback(self._graph_done)
        except Exception as exc:
            self.guard.report("comm_probe", exc)

    def _record_ready(self) -> None:
        if self.steps.timer is None:
            return
        ev = self.steps.record_event()
        if self.ev_ready is not None:
            self.steps.cuda.release(self.ev_ready)
        self.ev_ready = ev

    def _graph_done(self) -> None:
        """First final callback: the graph has run; queue the one that runs after all the others."""
        try:
            self.t_graph = perf_counter_ns()
            self.engine.queue_callback(self._backward_done)
        except Exception as exc:
            self.queued = False
            self.guard.report("comm_probe", exc)

    def _backward_done(self) -> None:
        """Last final callback: every wait of this backward is over."""
        try:
            t1 = perf_counter_ns()
            self.queued = False
            start = self.t_ready if self.last_seen else self.t_graph
            self.last_seen = False
            if self.cuda:
                self._gpu_wait()
            else:
                self.timer.add_wait(min(start, t1), t1)
            if self.order is not None:
                self._learned()
        except Exception as exc:
            self.guard.report("comm_probe", exc)

    def _gpu_wait(self) -> None:
        start, self.ev_ready = self.ev_ready, None
        if self.steps.timer is None or start is None:
            self.steps.cuda.release(start)
            return
        end = self.steps.record_event()
        if end is None:  # the event pool is used up (the GPU is far behind): no time for this backward
            self.steps.cuda.release(start, self.timer.first_issue)
            self.timer.first_issue = None
            return
        in_flight_end = self.steps.record_event() if self.timer.first_issue is not None else None
        self.timer.add_gpu_wait(start, end, in_flight_end)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _learned(self) -> None:
        """After the first backward, keep hooks on the first and the last gradient only."""
        order, self.order = self.order or [], None
        if not order:
            self.order = []  # nothing came: learn on the next backward
            return
        self.last = order[-1]
        keep = {order[0], self.last}
        for i, handle in enumerate(self.handles):
            if i not in keep:
                handle.remove()


def comm_timer(run: Any) -> CommTimer:
    """The run's :class:`CommTimer`, made on first use."""
    timer = getattr(run, "comm_timer", None)
    if timer is None:
        timer = run.comm_timer = CommTimer(run)
    return timer


def attach_ddp(run: Any, ddp_model: Any, hook: Any = None, state: Any = None) -> bool:
    """Time ``ddp_model``'s gradient communication into ``run`` (call once, before training).

    Puts the wait probe on its parameters (``comm_s``) and wraps its comm hook (``comm_in_flight_s``):
    ``hook``/``state`` are the comm hook you would otherwise register (default: PyTorch's
    ``allreduce_hook`` with the default process group). Returns whether communication is timed;
    a hook that cannot be registered (DDP takes one only) is reported once and leaves ``comm_s``.
    Training is unaffected either way.
    """
    try:
        timer = comm_timer(run)
        timed = timer.watch(ddp_model.parameters())
    except Exception as exc:
        run.guard.report("comm_probe", exc, "comm_s not measured")
        return False
    try:
        _register_hook(timer, ddp_model, hook, state)
    except Exception as exc:
        run.guard.report("comm_hook", exc, "comm_in_flight_s not measured")
    return timed


def attach_model(run: Any, model: Any, comm_hook: bool = True) -> str | None:
    """Time the communication of a wrapped model: ``"ddp"`` (probe and comm hook), ``"probe"`` (FSDP,
    another module, or ``comm_hook=False``: the wait probe only) or ``None`` (nothing to time).

    ``comm_hook=False`` where the user may still register a comm hook of their own (DDP takes one)."""
    if model is None:
        return None
    if is_ddp(model) and comm_hook:
        return "ddp" if attach_ddp(run, model) else None
    params = getattr(model, "parameters", None)
    if params is None:
        return None
    try:
        return "probe" if comm_timer(run).watch(params()) else None
    except Exception as exc:
        run.guard.report("comm_probe", exc, "comm_s not measured")
        return None


def auto_attach(run: Any, model: Any = None) -> None:
    """A distributed run's communication without user code: ``model`` when given, else the
    parameters of the first optimizer step (tried again at step ends until torch is imported)."""
    timer = comm_timer(run)
    if model is not None:
        attach_model(run, model, comm_hook=False)  # the user may register a comm hook after this
    if timer.probe is None:
        timer.watch_first_optimizer()
        if timer._optimizer_hook is None:
            run.steps.on_step_end(functools.partial(_retry_optimizer_watch, timer))


def _retry_optimizer_watch(timer: CommTimer) -> None:
    if timer.probe is None and timer._optimizer_hook is None:
        timer.watch_first_optimizer()


def is_ddp(model: Any) -> bool:
    ddp = sys.modules.get("torch.nn.parallel.distributed")
    return ddp is not None and isinstance(model, ddp.DistributedDataParallel)


def _register_hook(timer: CommTimer, ddp_model: Any, hook: Any, state: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    inner = hook or default_hooks.allreduce_hook
    cuda = next(ddp_model.parameters()).is_cuda
    guard = timer.guard

    def timed_hook(hook_state: Any, bucket: Any) -> Any:
        t0 = perf_counter_ns()
        if cuda:
            try:
                timer.issued_on_cuda()
            except Exception as exc:
                guard.report("comm_event", exc)
            return inner(hook_state, bucket)
        fut = inner(hook_state, bucket)

        def done(f: Any) -> Any:
            try:
                timer.add_interval(t0, perf_counter_ns())
            except Exception as exc:
                guard.report("comm_timing", exc)
            return f.value()

        return fut.then(done)

    # DDP checks the hook's annotations as objects (this module's are strings under PEP 563)
    timed_hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    ddp_model.register_comm_hook(state, timed_hook)
    timer.hooked = True
