"""Hugging Face ``Trainer`` integration: ``Trainer(..., callbacks=[GpulseCallback()])``.

Where each number comes from (transformers' event order: ``on_step_begin`` → forward/backward
per micro-batch → ``on_pre_optimizer_step`` → ``on_optimizer_step`` → ``on_step_end`` → log /
evaluate / save → next batch fetched → ``on_step_begin``):

* the step: from ``on_step_begin`` until every callback has run its ``on_step_end`` — and its
  ``on_log`` when the Trainer logs this step (``control.should_log``, set by then). The work a
  framework does after gpulse's own callback (the progress bar, ms-swift's ``logging.jsonl``, the
  Trainer's loss gathering for the log) is the step's: a second callback, :class:`_StepTail`,
  added last to the Trainer's callbacks at ``on_train_begin``, ends the step;
* data wait: from there (or from the end of ``on_evaluate`` / ``on_save``, also as the last
  callback) to the next ``on_step_begin``: the Trainer fetches the next optimizer step's batches
  there and does nothing else (evaluation and checkpointing end before their callbacks fire, so
  they are neither the step nor data wait);
* forward / backward: a forward pre-hook and hook on the model mark where forward starts and ends;
  backward runs from there until the next micro-batch's forward, ``on_substep_end`` or
  ``on_pre_optimizer_step`` (so gradient clipping counts as backward);
* optimizer: ``on_pre_optimizer_step`` → ``on_optimizer_step``;
* samples per rank: ``per_device_train_batch_size × gradient_accumulation_steps``;
* tokens per rank: the step's increase of ``state.num_input_tokens_seen`` (counted across ranks by
  the Trainer) ÷ world size, when ``include_num_input_tokens_seen`` is enabled;
* scalars from ``on_log`` (loss, learning_rate, grad_norm, ...) as ``log_<name>``;
* communication, in a distributed run: the wait for it and the time in flight of the Trainer's
  wrapped model (``model_wrapped``: DDP; FSDP gets the wait), see :mod:`gpulse.training.comm`.
"""

from __future__ import annotations

import os
import sys
from time import perf_counter_ns
from typing import Any

from transformers import TrainerCallback

from gpulse.training.run import Run


class GpulseCallback(TrainerCallback):
    """Per-step gpulse metrics for a ``transformers.Trainer`` (and trainers built on it: TRL, ms-swift).

    Pass ``run=`` to reuse a :class:`Run`; otherwise one is created at ``on_train_begin`` (once
    the process group exists, so the run id is shared) with ``run_kwargs`` (``name``, ``tags``,
    ``output_dir`` default to ``args.run_name`` and ``args.output_dir``).
    """

    def __init__(self, run: Run | None = None, **run_kwargs: Any) -> None:
        self.run = run
        self._own_run = run is None
        self._run_kwargs = run_kwargs
        self._handles: list[Any] = []
        self._model: Any = None
        self._idle_since = 0
        self._tokens_seen = 0
        self._samples = None
        self._world = 1
        self._count_tokens = False
        #: the counts of the step ``on_step_end`` saw, until the step ends
        self._pending: tuple[Any, Any, Any] | None = None
        self._pending_logs: dict[str, Any] = {}
        #: a :class:`_StepTail` ends the steps (set when the tail is added)
        self._tail = False

    # -- lifecycle ----------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        try:
            if self.run is None:
                kw = dict(self._run_kwargs)
                kw.setdefault("name", args.run_name or os.path.basename(str(args.output_dir)) or "hf")
                kw.setdefault("output_dir", args.output_dir)
                kw.setdefault("config", _args_summary(args))
                self.run = Run(**kw)
            if model is not None:
                if self.run.mfu.needs_model:
                    self.run.watch_model(model)
                self._hook(model)
            trainer = _trainer()
            if trainer is not None and not any(isinstance(c, _StepTail) for c in trainer.callback_handler.callbacks):
                trainer.add_callback(_StepTail(self))
            if self.run.world_size > 1:
                from gpulse.training.comm import attach_model

                attach_model(self.run, getattr(trainer, "model_wrapped", model))
            self._world = max(int(getattr(args, "world_size", 1) or 1), 1)
            self._samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
            mode = getattr(args, "include_num_input_tokens_seen", "no")
            self._count_tokens = mode not in ("no", False, None)
            self._tokens_seen = state.num_input_tokens_seen or 0
            self._idle_since = 0
        except Exception as exc:
            self._report("hf_train_begin", exc)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.end_pending()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.run is not None and self._own_run:
            self.run.finish()

    def _hook(self, model: Any) -> None:
        self._model = model
        self._handles.append(model.register_forward_pre_hook(self._forward_begin))
        self._handles.append(model.register_forward_hook(self._forward_end))

    def _forward_begin(self, module: Any, args: Any) -> None:
        run = self.run
        if run is not None and run.in_step and module.training:
            run.enter_phase("forward")

    def _forward_end(self, module: Any, args: Any, output: Any) -> None:
        run = self.run
        if run is not None and run.in_step and module.training:
            run.enter_phase("backward")

    # -- steps --------------------------------------------------------------------------------------
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the Trainer fetches the first step's micro-batches between here and on_step_begin: its data wait
        self._idle_since = perf_counter_ns()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self.run
        if run is None:
            return
        if self._pending is not None:  # logging was due but did not come: the step ends here
            self.end_pending()
        run.begin_step(self._idle_since)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None:
            self.run.exit_phase()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None and self.run.in_step:
            self.run.enter_phase("optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None:
            self.run.exit_phase()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Take the step's counts; the step ends after the other callbacks (:class:`_StepTail`), or
        here when there is no tail (the callbacks called by something other than a ``Trainer``)."""
        if self.run is None:
            return
        tokens = None
        if self._count_tokens:
            seen = state.num_input_tokens_seen or 0
            tokens = (seen - self._tokens_seen) // self._world or None
            self._tokens_seen = seen
        self._pending = (self._samples, tokens, state.global_step)
        if not self._tail:
            self.end_pending()

    def end_pending(self) -> None:
        """End the step whose counts ``on_step_end`` took (if it is still open); data wait starts now."""
        if self.run is not None and self._pending is not None:
            self.run.end_step(*self._pending)
            self._pending = None
            if self._pending_logs:
                self.run.log(**self._pending_logs)
                self._pending_logs = {}
        self._idle_since = perf_counter_ns()

    # -- logs and events ----------------------------------------------------------------------------
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        run = self.run
        if run is None or not logs:
            return
        scalars = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._pending is not None:  # the step is still open: its scalars go with it when it ends
            self._pending_logs.update(scalars)
        elif scalars:
            run.log(**scalars)
        self._idle_since = perf_counter_ns()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        if self.run is not None:
            self.run.mark("eval", _metrics_text(metrics), step=state.global_step)
            self._idle_since = perf_counter_ns()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None:
            self.run.mark("checkpoint", f"checkpoint-{state.global_step}", step=state.global_step)
            self._idle_since = perf_counter_ns()

    def _report(self, cause: str, exc: BaseException) -> None:
        if self.run is not None:
            self.run.guard.report(cause, exc)
        else:
            import logging

            logging.getLogger("gpulse.training").warning("gpulse: %s: %s", cause, exc)


class _StepTail(TrainerCallback):
    """The last of the Trainer's callbacks: ends gpulse's step once every callback has done its
    step-end work (its ``on_step_end``, and its ``on_log`` when this step is logged), and starts the
    data wait after evaluation and checkpoints. Callbacks run in list order
    (``transformers.trainer_callback.CallbackHandler.call_event``), so the one added last runs last."""

    def __init__(self, main: GpulseCallback) -> None:
        self.main = main
        main._tail = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # DefaultFlowCallback set should_log before: the Trainer logs right after on_step_end
        if not control.should_log:
            self.main.end_pending()

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.main.end_pending()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.main.end_pending()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.main.end_pending()


def _trainer() -> Any:
    """The ``Trainer`` calling this callback (``on_train_begin``): callbacks are handed neither it nor
    its ``model_wrapped`` (DDP, FSDP, ...), only the unwrapped model."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "model_wrapped") and hasattr(owner, "callback_handler"):
            return owner
        frame = frame.f_back
    return None


def _args_summary(args: Any) -> dict[str, Any]:
    keys = (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "learning_rate",
        "max_steps",
        "num_train_epochs",
        "bf16",
        "fp16",
        "gradient_checkpointing",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "world_size",
    )
    return {k: getattr(args, k, None) for k in keys if getattr(args, k, None) is not None}


def _metrics_text(metrics: Any) -> str:
    if not metrics:
        return ""
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())[:1000]
