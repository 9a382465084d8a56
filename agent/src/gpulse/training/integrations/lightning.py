"""PyTorch Lightning integration: ``Trainer(callbacks=[GpulseLightningCallback()])``.

One gpulse step per training batch. Phases follow Lightning's hook order (automatic
optimisation): ``on_train_batch_start`` → forward (``training_step``) → ``on_before_backward`` →
backward → ``on_after_backward`` → ``on_before_optimizer_step`` → optimizer → ``on_train_batch_end``.
Data wait is the gap from one batch's end to the next batch's start, which is where the loop
fetches the next batch. Nothing here synchronises the GPU (unlike ``ThroughputMonitor``): the loss
is handed to :meth:`Run.log` as a tensor and read only once it is available.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

try:  # the package is ``lightning`` (unified) or ``pytorch_lightning``; support both
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on which distribution is installed
    from pytorch_lightning.callbacks import Callback

from gpulse.training.run import Run


class GpulseLightningCallback(Callback):
    """Per-step gpulse metrics for a Lightning ``Trainer``; ``run_kwargs`` go to :class:`Run`."""

    def __init__(self, run: Run | None = None, samples_fn: Any = None, tokens_fn: Any = None, **run_kwargs: Any):
        super().__init__()
        self.run = run
        self._own_run = run is None
        self._run_kwargs = run_kwargs
        self._samples_fn = samples_fn or _batch_size
        self._tokens_fn = tokens_fn
        self._idle_since = 0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.run is not None:
            return
        kw = dict(self._run_kwargs)
        kw.setdefault("name", type(pl_module).__name__)
        kw.setdefault("output_dir", trainer.default_root_dir)
        kw.setdefault(
            "config", {"max_steps": trainer.max_steps, "accumulate_grad_batches": trainer.accumulate_grad_batches}
        )
        self.run = Run(**kw)
        if self.run.mfu.needs_model:
            self.run.watch_model(pl_module)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # the loop fetches (prefetches) a batch between here and the first on_train_batch_start: its data wait
        self._idle_since = perf_counter_ns()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        run = self.run
        if run is None:
            return
        run.begin_step(self._idle_since)
        run.enter_phase("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.run is not None and self.run.in_step:
            self.run.enter_phase("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.run is not None:
            self.run.exit_phase()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.run is not None and self.run.in_step:
            self.run.enter_phase("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        run = self.run
        if run is None:
            return
        samples = tokens = None
        try:
            samples = self._samples_fn(batch)
            if self._tokens_fn is not None:
                tokens = self._tokens_fn(batch)
        except Exception as exc:
            run.guard.report("lightning_batch_size", exc)
        run.end_step(samples, tokens)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            run.log(loss=loss.detach())
        self._idle_since = perf_counter_ns()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.run is not None and not trainer.sanity_checking:
            self.run.mark("eval", step=trainer.global_step)
            self._idle_since = perf_counter_ns()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        if self.run is not None:
            self.run.mark("checkpoint", step=trainer.global_step)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.run is not None and self._own_run:
            self.run.finish("interrupted" if isinstance(exception, KeyboardInterrupt) else "failed")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and self.run is not None and self._own_run:
            self.run.finish()


def _batch_size(batch: Any) -> int | None:
    """Leading dimension of the first tensor in the batch (tensor, tuple/list or dict)."""
    if hasattr(batch, "shape") and len(batch.shape):
        return int(batch.shape[0])
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = _batch_size(item)
            if n is not None:
                return n
    return None
