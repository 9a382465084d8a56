"""What a run's records become: the fields of its points, named and typed as ``gpulse.schema`` says.

Runs on the worker thread. A :class:`~gpulse.training.step.StepRecord` becomes one ``train_step``
point, a row of :class:`~gpulse.channel.protocol.StepRows` (durations carried as integer nanoseconds
and read as seconds, rates, MFU, memory, logged scalars as ``log_<name>``, phases as ``<phase>_s``
/ ``phase_<name>_s``); the run's start and end become ``train_run`` fields. A run may use at most :data:`~gpulse.channel.protocol.MAX_OPEN_FIELDS_PER_RUN` distinct
``log_*`` / ``phase_*`` names (the agent enforces the same): more is a mistake, named once in the
log, and the values of further new names are dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpulse.channel.protocol import (
    KIND_FLOAT,
    KIND_INT,
    KIND_NS,
    MAX_OPEN_FIELDS_PER_RUN,
    FieldShape,
)
from gpulse.lineprotocol.limits import INT64_MAX, INT64_MIN
from gpulse.training.cuda import CudaDevice
from gpulse.training.errors import Guard
from gpulse.training.mfu import Mfu
from gpulse.training.step import QueuedStep, StepRecord

STANDARD_PHASES = ("forward", "backward", "optimizer")
_MEMORY_FIELDS = ("mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes", "alloc_retries")
#: ``train_step`` fields carried as integers; durations (``*_s`` of a phase, the step, the data wait,
#: communication) are integer nanoseconds; the rest (rates, MFU, logged values) floats.
_INT_FIELDS = frozenset(("step", "start_time_ns", "end_time_ns", "samples", "tokens", *_MEMORY_FIELDS))
_DURATIONS = frozenset(("step_time_s", "data_wait_s", "comm_s", "comm_in_flight_s"))
#: Shapes a run keeps (field-name sets: a handful, more only with ever-changing log names).
MAX_SHAPES = 256


class StepShape(FieldShape):
    """The shape of a step point, made from the names in the order the point maker found them; a
    name found twice (a phase entered twice, two logged names cleaned to one) becomes one field:
    durations are added up, other values the last one kept (``merged``)."""

    __slots__ = ("merge",)

    def __init__(self, found: tuple[str, ...]) -> None:
        names = tuple(dict.fromkeys(found))
        super().__init__(names, "".join(map(_kind, names)))
        #: for each name found, the index of its field; ``None`` when every name is found once
        self.merge = [names.index(n) for n in found] if len(names) < len(found) else None

    def merged(self, found: list[Any]) -> list[Any]:
        values: list[Any] = [None] * len(self.names)
        for i, v in zip(self.merge, found, strict=True):  # type: ignore[arg-type]
            values[i] = v + values[i] if values[i] is not None and self.kinds[i] == KIND_NS else v
        return values


def _kind(name: str) -> str:
    """How a step field's value is carried (:class:`~gpulse.channel.protocol.FieldShape`)."""
    if name in _INT_FIELDS:
        return KIND_INT
    if name in _DURATIONS or name.startswith("phase_") or (name.endswith("_s") and name[:-2] in STANDARD_PHASES):
        return KIND_NS
    if name.endswith("_gpu_s") and name[:-6] in STANDARD_PHASES:
        return KIND_NS
    return KIND_FLOAT


#: Longest ``train_run.config`` JSON kept (the schema's string limit).
MAX_CONFIG = 4096
_INF = float("inf")
_INT64 = range(INT64_MIN, INT64_MAX + 1)


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
        #: field names -> their shape (a run has a handful; more only with ever-changing log names)
        self._shapes: dict[tuple[str, ...], StepShape] = {}
        #: a step's layout (:meth:`queued_row`) -> its shape, for layouts whose names all have fields
        self._layouts: dict[tuple[int, tuple[Any, ...], tuple[str, ...]], StepShape] = {}
        #: a phase name (host times, GPU times) or a logged name -> its field name, for names already
        #: accepted (bounded together)
        self._cpu_keys: dict[str, str] = {}
        self._gpu_keys: dict[str, str] = {}
        self._log_keys: dict[str, str] = {}

    def queued_row(self, item: QueuedStep, offset_ns: int) -> tuple[StepShape, tuple[int | float, ...]]:
        """What :meth:`step_row` makes of the step ``item`` as the training thread queued it (without
        GPU times), made faster for the steps a run repeats.

        This runs once per step on the background thread. A step whose values need nothing done to
        them (an ``int`` step number and counts, ``float`` logs) and whose layout (which fields it
        has, its phase and log names) was seen before takes its shape from a cache keyed by that
        layout and only gathers its values, in the order :meth:`step_row` puts them; any other
        step, and the first of each layout, is made by :meth:`step_row`."""
        (step, t0, t1, wait, samples, tokens, phases, _pairs, mem, comm, in_flight), logs = item
        if type(step) is not int or step not in _INT64:
            return self.step_row(StepRecord.queued(item), offset_ns, None)
        values: list[Any] = [step, t0 + offset_ns, t1 + offset_ns, t1 - t0]
        layout = 0  # which of the optional fields the step has, a bit each
        if wait is not None:
            layout = 1
            values.append(wait if type(wait) is int else int(wait))
        if phases:
            if len(phases) & 1:  # not (name, ns) pairs: step_row says so
                return self.step_row(StepRecord.queued(item), offset_ns, None)
            values += phases[1::2]
        if comm is not None:
            layout |= 2
            values.append(comm if type(comm) is int else int(comm))
        if in_flight is not None:
            layout |= 4
            values.append(in_flight if type(in_flight) is int else int(in_flight))
        if (samples and (type(samples) is not int or samples not in _INT64)) or (
            tokens and (type(tokens) is not int or tokens not in _INT64)
        ):
            return self.step_row(StepRecord.queued(item), offset_ns, None)  # converted, or left out, there
        if logs:
            for value in logs.values():
                if type(value) is not float or value - value != 0.0:  # converted, or left out, by step_row
                    return self.step_row(StepRecord.queued(item), offset_ns, None)
        dt = (t1 - t0) / 1e9
        timed = dt > 0  # the rates need a duration
        if samples:
            layout |= 24 if timed else 8
            values += (samples, samples / dt) if timed else (samples,)
        if tokens:
            layout |= 96 if timed else 32
            values += (tokens, tokens / dt) if timed else (tokens,)
            if timed:
                mfu = self.mfu
                rates = mfu.rates(tokens, samples, dt, self.gpus) if mfu.fixed or mfu.model is not None else None
                if rates is not None:
                    layout |= 128
                    values.append(rates[0])
                    if rates[1] is not None:
                        layout |= 256
                        values.append(rates[1])
        if mem is not None:
            layout |= 512
            values += map(int, mem[:4])
        if logs:
            values += logs.values()
        key = (layout, phases[::2], tuple(logs) if logs else ())
        shape = self._layouts.get(key)
        if shape is None:
            return self._first_of_layout(key, item, offset_ns)
        if shape.merge is not None:  # a name twice (a phase entered twice): one field
            values = shape.merged(values)
        values.append(t1 + offset_ns)  # the timestamp, last
        return shape, tuple(values)

    def _first_of_layout(
        self, key: tuple[int, tuple[Any, ...], tuple[str, ...]], item: QueuedStep, offset_ns: int
    ) -> tuple[StepShape, tuple[int | float, ...]]:
        """The first step of a layout, made by :meth:`step_row`; its shape is kept for the layout
        when every phase and log name of it has its field (a name over the run's budget is named
        again for every step that has it, as :meth:`step_row` does)."""
        shape, row = self.step_row(StepRecord.queued(item), offset_ns, None)
        _, phase_names, log_names = key
        if all(n in self._cpu_keys for n in phase_names) and all(n in self._log_keys for n in log_names):
            if len(self._layouts) >= MAX_SHAPES:
                self._layouts.clear()
            self._layouts[key] = shape
        return shape, row

    def step_row(
        self, rec: StepRecord, offset_ns: int, gpu_times: dict[str, float] | None
    ) -> tuple[StepShape, tuple[int | float, ...]]:
        """The ``train_step`` point of ``rec`` as a shape and a row (:class:`~gpulse.channel.protocol.StepRows`,
        the timestamp last); ``offset_ns`` turns ``perf_counter_ns`` into Unix ns: the one definition
        of a step's fields (:meth:`queued_row` reuses the shapes it makes).

        Every value is a finite ``int`` or ``float`` of the kind the point's shape says (durations in
        integer nanoseconds): values the integrations or the user handed over in another type (a
        NumPy int, a tensor) are converted here, and a value that is not a number is left out and
        named once. Names are looked up in caches, and the common cases (an ``int`` count, a
        ``float`` logged) take no call."""
        t0, t1 = rec.t0_ns, rec.t1_ns
        step = rec.step
        if type(step) is int and step in _INT64:
            names = ["step", "start_time_ns", "end_time_ns", "step_time_s"]
            values: list[Any] = [step, t0 + offset_ns, t1 + offset_ns, t1 - t0]
        else:
            step = self._int("step", step)
            names = ["start_time_ns", "end_time_ns", "step_time_s"]
            values = [t0 + offset_ns, t1 + offset_ns, t1 - t0]
            if step is not None:
                names.insert(0, "step")
                values.insert(0, step)
        name_ = names.append
        value_ = values.append
        wait = rec.wait_ns
        if wait is not None:
            name_("data_wait_s")
            value_(wait if type(wait) is int else int(wait))
        phases = rec.phases
        if phases:
            keys = self._cpu_keys
            pairs = iter(phases)
            for name, ns in zip(pairs, pairs, strict=True):  # flat: (name, ns, name, ns, ...)
                key = keys.get(name) or self._phase_key(name, False)
                if key is not None:
                    name_(key)
                    value_(ns)
        comm, in_flight = rec.comm_ns, rec.inflight_ns
        if gpu_times:
            for name, s in gpu_times.items():
                if name == "comm":  # a comm hook's own count wins over the GPU's
                    if comm is None:
                        comm = round(s * 1e9)
                    continue
                if name == "comm_in_flight":
                    if in_flight is None:
                        in_flight = round(s * 1e9)
                    continue
                key = self._phase_key(name, True)
                if key is not None:
                    name_(key)
                    value_(round(s * 1e9))
        if comm is not None:
            name_("comm_s")
            value_(comm if type(comm) is int else int(comm))
        if in_flight is not None:
            name_("comm_in_flight_s")
            value_(in_flight if type(in_flight) is int else int(in_flight))
        samples, tokens = rec.samples, rec.tokens
        dt = (t1 - t0) / 1e9
        if samples and (type(samples) is not int or samples not in _INT64):
            samples = self._int("samples", samples)
        if samples:
            name_("samples")
            value_(samples)
            if dt > 0:
                name_("samples_per_s")
                value_(samples / dt)
        if tokens and (type(tokens) is not int or tokens not in _INT64):
            tokens = self._int("tokens", tokens)
        if tokens:
            name_("tokens")
            value_(tokens)
            if dt > 0:
                name_("tokens_per_s")
                value_(tokens / dt)
                mfu = self.mfu
                rates = mfu.rates(tokens, samples, dt, self.gpus) if mfu.fixed or mfu.model is not None else None
                if rates is not None:
                    name_("tflops")
                    value_(rates[0])
                    if rates[1] is not None:
                        name_("mfu")
                        value_(rates[1])
        mem = rec.memory
        if mem is not None:
            names += _MEMORY_FIELDS
            values += map(int, mem[:4])
        logs = rec.logs
        if logs:
            keys = self._log_keys
            for name, value in logs.items():
                key = keys.get(name) or self._log_key(name)
                if type(value) is not float or value - value != 0.0:  # not a finite float (inf - inf is nan)
                    value = self.scalar(name, value)  # also when the name is not kept: it frees a CUDA copy's event
                if key is not None and value is not None:
                    name_(key)
                    value_(value)
        shape = self._shapes.get(tuple(names)) or self._shape(tuple(names))
        if shape.merge is not None:  # a name twice (a phase entered twice): one field
            values = shape.merged(values)
        values.append(t1 + offset_ns)  # the timestamp, last
        return shape, tuple(values)

    def _shape(self, names: tuple[str, ...]) -> StepShape:
        """The shape of a step point with these field names (cached; a name twice is merged)."""
        if len(self._shapes) >= MAX_SHAPES:
            self._shapes.clear()
        shape = self._shapes[names] = StepShape(names)
        return shape

    def _int(self, name: str, value: Any) -> int | None:
        """``value`` as an ``int`` when it is a whole number of any type (``None`` otherwise, named once)."""
        try:
            i = int(value)
            if i == value and INT64_MIN <= i <= INT64_MAX:
                return i
        except Exception:
            pass
        self.guard.report("not_an_integer", detail=f"{name}={value!r} is not a whole number (int64); left out")
        return None

    def scalar(self, key: str, value: Any) -> float | None:
        """A logged value as a float, reading tensors only when that cannot wait for the GPU."""
        try:
            if type(value) is float:
                v = value
            elif type(value) is tuple:  # (pinned CPU copy, CUDA event), completed by now
                self.cuda.release(value[1])
                v = float(value[0])
            elif isinstance(value, (int, float)):
                v = float(value)
            else:
                device = getattr(value, "device", None)
                if device is not None and getattr(device, "type", "cpu") != "cpu":
                    self.guard.report("log_device_tensor", detail=f"{key}: tensor not on CPU was not read")
                    return None
                if hasattr(value, "numel") and value.numel() != 1:
                    self.guard.report("log_not_scalar", detail=f"{key}: only one-element values are logged")
                    return None
                v = float(value)
        except Exception as exc:
            self.guard.report("log_value", exc, key)
            return None
        if v - v != 0.0:  # NaN or ±Inf (inf - inf is NaN): JSON cannot carry it
            self.guard.report("nonfinite_value", detail=f"log {key}: {v} dropped")
            return None
        return v

    # -- open fields ------------------------------------------------------------------------------
    def _phase_key(self, name: str, gpu: bool) -> str | None:
        """``forward_s`` / ``forward_gpu_s`` for the standard phases, ``phase_<name>_s`` for the others."""
        suffix = "_gpu_s" if gpu else "_s"
        cache = self._gpu_keys if gpu else self._cpu_keys
        if name in STANDARD_PHASES:
            key = cache[name] = name + suffix
            return key
        return self._open_key(cache, name, f"phase_{name}{suffix}")

    def _log_key(self, name: str) -> str | None:
        key = "log_" + (re.sub(r"[^A-Za-z0-9_./\-]", "_", str(name))[:64] or "value")
        return self._open_key(self._log_keys, name, key)

    def _open_key(self, cache: dict[str, str], name: str, key: str) -> str | None:
        """``key`` when the run may use it (it did already, or its budget allows one more name);
        remembered in ``cache`` under ``name`` (the caches together hold at most twice the budget)."""
        if key not in self._names:
            if len(self._names) >= MAX_OPEN_FIELDS_PER_RUN:
                self.guard.report(
                    "too_many_open_fields",
                    detail=f"this run logs more than {MAX_OPEN_FIELDS_PER_RUN} distinct scalars/phases, which is "
                    f"a mistake: {key} and further new names are dropped",
                )
                return None
            self._names.add(key)
        if len(self._cpu_keys) + len(self._gpu_keys) + len(self._log_keys) < 2 * MAX_OPEN_FIELDS_PER_RUN:
            cache[name] = key
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
