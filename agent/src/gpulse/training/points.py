"""What a run's records become: the fields of its points, named and typed as ``gpulse.schema`` says.

Runs on the worker thread. A :class:`~gpulse.training.step.StepRecord` becomes the fields of one
``train_step`` point (times in seconds, rates, MFU, memory, logged scalars as ``log_<name>``,
phases as ``<phase>_s`` / ``phase_<name>_s``); the run's start and end become ``train_run``
fields. A run may use at most :data:`~gpulse.channel.protocol.MAX_OPEN_FIELDS_PER_RUN` distinct
``log_*`` / ``phase_*`` names (the agent enforces the same): more is a mistake, named once in the
log, and the values of further new names are dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpulse.channel.protocol import MAX_OPEN_FIELDS_PER_RUN
from gpulse.training.cuda import CudaDevice
from gpulse.training.errors import Guard
from gpulse.training.mfu import Mfu
from gpulse.training.step import StepRecord

STANDARD_PHASES = ("forward", "backward", "optimizer")
#: GPU timings of communication (:mod:`gpulse.training.comm`) and the fields they fill
COMM_FIELDS = {"comm": "comm_s", "comm_in_flight": "comm_in_flight_s"}
#: Longest ``train_run.config`` JSON kept (the schema's string limit).
MAX_CONFIG = 4096
_INF = float("inf")


class PointMaker:
    """Fields for one run's points; remembers the run's open-field names (bounded)."""

    def __init__(self, guard: Guard, mfu: Mfu, cuda: CudaDevice) -> None:
        self.guard = guard
        self.mfu = mfu
        self.cuda = cuda
        #: GPUs this rank uses (the worker updates it): MFU divides by their peak
        self.gpus = 1
        #: the open-field names this run used (at most MAX_OPEN_FIELDS_PER_RUN)
        self._names: set[str] = set()
        #: a logged name or (phase, gpu) -> its field name, for names already accepted (bounded)
        self._keys: dict[Any, str] = {}

    def step_fields(self, rec: StepRecord, offset_ns: int, gpu_times: dict[str, float] | None) -> dict[str, Any]:
        """The ``train_step`` fields of ``rec``; ``offset_ns`` turns ``perf_counter_ns`` into Unix ns."""
        t0, t1 = rec.t0_ns, rec.t1_ns
        dt = (t1 - t0) / 1e9
        fields: dict[str, Any] = {
            "step": rec.step,
            "start_time_ns": t0 + offset_ns,
            "end_time_ns": t1 + offset_ns,
            "step_time_s": dt,
        }
        if rec.wait_ns is not None:
            fields["data_wait_s"] = rec.wait_ns / 1e9
        for name, ns in rec.phases:
            key = self._phase_key(name, False)
            if key is not None:
                fields[key] = fields.get(key, 0.0) + ns / 1e9
        if gpu_times:
            for name, s in gpu_times.items():
                key = COMM_FIELDS.get(name) or self._phase_key(name, True)
                if key is not None:
                    fields[key] = s
        if rec.comm_ns is not None:
            fields["comm_s"] = rec.comm_ns / 1e9
        if rec.inflight_ns is not None:
            fields["comm_in_flight_s"] = rec.inflight_ns / 1e9
        samples, tokens = rec.samples, rec.tokens
        if samples:
            fields["samples"] = samples
            if dt > 0:
                fields["samples_per_s"] = samples / dt
        if tokens:
            fields["tokens"] = tokens
            if dt > 0:
                fields["tokens_per_s"] = tokens / dt
                self.mfu.add(fields, tokens, samples, dt, self.gpus)
        mem = rec.memory
        if mem is not None:
            fields["mem_allocated_bytes"], fields["mem_reserved_bytes"], fields["mem_peak_bytes"] = mem[:3]
            fields["alloc_retries"] = mem[3]
        if rec.logs:
            for name, value in rec.logs.items():
                key = self._log_key(name)
                v = self.scalar(name, value)
                if key is not None and v is not None:
                    fields[key] = v
        return fields

    def scalar(self, key: str, value: Any) -> float | None:
        """A logged value as a float, reading tensors only when that cannot wait for the GPU."""
        try:
            if type(value) is tuple:  # (pinned CPU copy, CUDA event), completed by now
                self.cuda.release(value[1])
                return float(value[0])
            if isinstance(value, (int, float)):
                return float(value)
            device = getattr(value, "device", None)
            if device is not None and getattr(device, "type", "cpu") != "cpu":
                self.guard.report("log_device_tensor", detail=f"{key}: tensor not on CPU was not read")
                return None
            if hasattr(value, "numel") and value.numel() != 1:
                self.guard.report("log_not_scalar", detail=f"{key}: only one-element values are logged")
                return None
            return float(value)
        except Exception as exc:
            self.guard.report("log_value", exc, key)
            return None

    # -- open fields ------------------------------------------------------------------------------
    def _phase_key(self, name: str, gpu: bool) -> str | None:
        """``forward_s`` / ``forward_gpu_s`` for the standard phases, ``phase_<name>_s`` for the others."""
        suffix = "_gpu_s" if gpu else "_s"
        if name in STANDARD_PHASES:
            return name + suffix
        key = self._keys.get((name, gpu))
        return key if key is not None else self._open_key((name, gpu), f"phase_{name}{suffix}")

    def _log_key(self, name: str) -> str | None:
        key = self._keys.get(name)
        if key is not None:
            return key
        return self._open_key(name, "log_" + (re.sub(r"[^A-Za-z0-9_./\-]", "_", str(name))[:64] or "value"))

    def _open_key(self, ident: Any, key: str) -> str | None:
        """``key`` when the run may use it (it did already, or its budget allows one more name)."""
        if key not in self._names:
            if len(self._names) >= MAX_OPEN_FIELDS_PER_RUN:
                self.guard.report(
                    "too_many_open_fields",
                    detail=f"this run logs more than {MAX_OPEN_FIELDS_PER_RUN} distinct scalars/phases, which is "
                    f"a mistake: {key} and further new names are dropped",
                )
                return None
            self._names.add(key)
        if len(self._keys) < 2 * MAX_OPEN_FIELDS_PER_RUN:
            self._keys[ident] = key
        return key


def finite_fields(fields: dict[str, Any], measurement: str, guard: Guard) -> dict[str, Any]:
    """``fields`` without NaN/Inf floats (JSON cannot carry them; each is counted)."""
    for k, v in list(fields.items()):
        if type(v) is float and (v != v or v in (_INF, -_INF)):
            del fields[k]
            guard.report("nonfinite_value", detail=f"{measurement}.{k} dropped")
    return fields


def run_fields(event: str, status: str, name: str, config: Mapping[str, Any], pid: int) -> dict[str, Any]:
    """The ``train_run`` fields every lifecycle point has (the end point adds what the run did)."""
    return {"event": event, "status": status, "name": name[:256], "config": config_json(config), "pid": pid}


def config_json(config: Mapping[str, Any]) -> str:
    """A run's configuration as JSON for ``train_run.config``, cut to :data:`MAX_CONFIG` characters."""
    try:
        text = json.dumps(config, default=str, sort_keys=True)
    except Exception:
        text = json.dumps({k: str(v) for k, v in config.items()})
    return text if len(text) <= MAX_CONFIG else text[: MAX_CONFIG - 3] + "..."
