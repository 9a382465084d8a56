"""PyTorch Lightning integration: ``Trainer(callbacks=[GpulseLightningCallback()])``.

One gpulse step per optimizer step (``trainer.global_step``), as the HF callback counts: with
``accumulate_grad_batches=k`` a step spans k training batches. Phases follow Lightning's hook order
(automatic optimisation): ``on_train_batch_start`` → forward (``training_step``) →
``on_before_backward`` → backward → ``on_after_backward`` → ``on_before_optimizer_step`` → optimizer
→ ``on_train_batch_end``; the phases of a step's batches add up. Data wait is the gap from one
batch's end to the next batch's start, where the loop fetches the next batch (inside a step, too).
The loss logged is the one ``training_step`` returned, as Lightning's own logs show it: Lightning
divides it by k before backward, and this undoes that and takes the mean of the step's batches.
Nothing here synchronises the GPU (unlike ``ThroughputMonitor``): the loss is handed to
:meth:`Run.log` as a tensor and read only once it is available.

In a distributed run the callback times the communication of the strategy's wrapped model (DDP:
the wait and the time in flight; FSDP: the wait), see :mod:`gpulse.training.comm`.
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
        self._stepped = False
        self._samples: int | None = None
        self._tokens: int | None = None
        self._loss: Any = None
        self._batches = 0

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

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """The strategy has wrapped the model by now (DDP, FSDP): time its communication."""
        if self.run is not None and getattr(trainer, "world_size", 1) > 1:
            from gpulse.training.comm import attach_model

            attach_model(self.run, getattr(trainer.strategy, "model", None))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        run = self.run
        if run is None:
            return
        if not run.in_step:
            run.begin_step(self._idle_since)
        elif self._idle_since:  # a batch of the same optimizer step: its fetch is data wait too
            run.add_data_wait(perf_counter_ns() - self._idle_since)
        run.enter_phase("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.run is not None and self.run.in_step:
            self.run.enter_phase("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.run is not None:
            self.run.exit_phase()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._stepped = True
        if self.run is not None and self.run.in_step:
            self.run.enter_phase("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        run = self.run
        if run is None:
            return
        try:
            self._samples = _add(self._samples, self._samples_fn(batch))
            if self._tokens_fn is not None:
                self._tokens = _add(self._tokens, self._tokens_fn(batch))
        except Exception as exc:
            run.guard.report("lightning_batch_size", exc)
        self._add_loss(trainer, pl_module, outputs)
        if self._stepped:  # this batch ended an optimizer step
            self._end_step(trainer)
        self._idle_since = perf_counter_ns()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.run is not None and self.run.in_step:  # batches left without an optimizer step
            self._end_step(trainer)

    def _add_loss(self, trainer: Any, pl_module: Any, outputs: Any) -> None:
        """The batch's loss as ``training_step`` returned it (a tensor: no read, no sync)."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None or not hasattr(loss, "detach"):
            return
        loss = loss.detach()
        if getattr(pl_module, "automatic_optimization", True):  # Lightning divided it by k for backward
            loss = loss * max(int(getattr(trainer, "accumulate_grad_batches", 1) or 1), 1)
        self._loss = loss if self._loss is None else self._loss + loss
        self._batches += 1

    def _end_step(self, trainer: Any) -> None:
        run = self.run
        run.end_step(self._samples, self._tokens, int(trainer.global_step) if self._stepped else None)
        if self._loss is not None:
            run.log(loss=self._loss / self._batches if self._batches > 1 else self._loss)
        self._stepped = False
        self._samples = self._tokens = self._loss = None
        self._batches = 0

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


def _add(total: int | None, n: int | None) -> int | None:
    return n if total is None else total + (n or 0)


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
