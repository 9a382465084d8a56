"""Model FLOPs utilisation for a run: FLOPs per token (given, or derived from the model) over the peak.

The formulas and the peak table are in :mod:`gpulse.training.flops` (imported only when needed).
The peak comes from ``peak_flops=``, else ``GPULSE_PEAK_FLOPS``, else the GPU's name and the dtype
once the worker knows the device.
"""

from __future__ import annotations

import os
from typing import Any

from gpulse.training.errors import Guard

PEAK_ENV = "GPULSE_PEAK_FLOPS"


class Mfu:
    """Adds ``tflops`` and ``mfu`` to step fields, and what they were computed from to the run's end point."""

    def __init__(self, guard: Guard, flops_per_token: float | None, peak_flops: float | None, dtype: Any) -> None:
        self.guard = guard
        self.dtype = dtype
        self.fixed = flops_per_token
        self.model: Any = None
        self.last_fpt: float | None = None
        if peak_flops is None and os.environ.get(PEAK_ENV):
            try:
                peak_flops = float(os.environ[PEAK_ENV])
            except ValueError as exc:
                guard.report(f"bad_{PEAK_ENV}", exc)
        self.peak: float | None = peak_flops
        self.peak_label = "override" if peak_flops else ""

    @property
    def needs_model(self) -> bool:
        """No FLOPs per token yet: integrations pass the model they see."""
        return self.model is None and not self.fixed

    def watch_model(self, model: Any, seq_len: int | None = None) -> None:
        """Derive FLOPs per token from a model's parameter count and config."""
        try:
            from gpulse.training.flops import from_model

            self.model = from_model(model, seq_len)
        except Exception as exc:
            self.guard.report("flops_model", exc)

    def set_flops_per_token(self, value: float) -> None:
        self.fixed = float(value)

    def detect_peak(self, device_name: str) -> None:
        """The peak for this GPU model and dtype, unless one was given (once, on the worker)."""
        if self.peak is not None:
            return
        from gpulse.training.flops import lookup_peak

        found = lookup_peak(device_name, self.dtype)
        if found is None:
            self.guard.report("unknown_peak", detail="GPU model not in the peak table; pass peak_flops= for MFU")
            self.peak = 0.0
        else:
            self.peak_label, self.peak = found

    def rates(self, tokens: int, samples: int | None, dt: float, gpus: int) -> tuple[float, float | None] | None:
        """``(tflops, mfu)`` for a step of ``tokens`` in ``dt`` seconds on ``gpus`` (``mfu`` once the
        peak is known); ``None`` without FLOPs per token. Plain floats, whatever type the FLOPs came in."""
        if self.fixed:
            fpt = self.fixed
        elif self.model is not None:
            fpt = self.model.per_token(tokens / samples if samples else None)
        else:
            return None
        self.last_fpt = fpt
        rate = float(fpt) * tokens / dt
        return rate / 1e12, (rate / (float(self.peak) * max(gpus, 1)) if self.peak else None)

    def end_fields(self, fields: dict[str, Any]) -> None:
        """The formula, FLOPs per token and peak behind the run's figures, on its end point."""
        if self.model is not None or self.fixed:
            fields["mfu_formula"] = "given" if self.fixed else self.model.formula
        if self.last_fpt:
            fields["flops_per_token"] = self.last_fpt
        if self.peak:
            fields["peak_flops"] = self.peak

    def describe(self) -> dict[str, Any]:
        """For the end point's diagnostics: how FLOPs were derived and where the peak came from."""
        out: dict[str, Any] = {}
        if self.model is not None:
            out["flops"] = self.model.describe()
        if self.peak_label:
            out["peak"] = self.peak_label
        return out
