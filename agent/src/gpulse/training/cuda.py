"""The run's CUDA device: found without initialising CUDA, used without ever waiting for the GPU.

gpulse never imports torch: it looks in ``sys.modules`` and, once the training script has
initialised CUDA (``torch.cuda.is_initialized()`` is a flag, it initialises nothing), takes the
current device, a pool of timing events (:class:`~gpulse.training.timing.CudaTimer`) and the
allocator probe (:class:`~gpulse.training.memory.MemoryProbe`). One-element CUDA tensors passed to
``run.log`` are copied asynchronously and read by the worker once their event has completed. The
worker asks which GPUs the rank uses (to register them with the agent) and the device's name
(for the MFU peak).
"""

from __future__ import annotations

import sys
from typing import Any

from gpulse.training.errors import Guard
from gpulse.training.timing import CudaTimer


class CudaDevice:
    """The CUDA device of this rank, once there is one (``device`` stays ``None`` without CUDA)."""

    def __init__(self, guard: Guard, gpu_timing: bool = True, track_memory: bool = True) -> None:
        self.guard = guard
        self.gpu_timing = gpu_timing
        self.track_memory = track_memory
        self.torch: Any = None
        self.device: int | None = None
        self.timer: CudaTimer | None = None
        self.memory: Any = None
        #: set when the device was found: the worker registers the GPUs and looks up the peak
        self.changed = False

    def detect(self) -> bool:
        """Attach to the current device if this process has initialised CUDA; whether it did."""
        torch = sys.modules.get("torch")
        try:
            if torch is None or not torch.cuda.is_initialized():  # a flag: never initialises CUDA itself
                return False
            self.attach(torch, torch.cuda.current_device())  # per thread: read on the training thread
            return True
        except Exception as exc:
            self.guard.report("cuda_detect", exc)
            return False

    def attach(self, torch: Any, device: int) -> None:
        """Use CUDA device ``device`` of ``torch`` for events, memory counters and GPU registration."""
        self.torch = torch
        if self.gpu_timing:
            self.timer = CudaTimer(torch)
        if self.track_memory:
            from gpulse.training.memory import MemoryProbe

            self.memory = MemoryProbe(torch, device)
        self.device = device
        self.changed = True

    # -- the training thread ----------------------------------------------------------------------
    def copy_logs(self, logs: dict[str, Any]) -> None:
        """Start an asynchronous copy of one-element CUDA tensors; the worker reads them when done.

        A copied value becomes ``(pinned CPU copy, CUDA event)``."""
        timer = self.timer
        if timer is None:
            return  # no events to know when a copy is done: the worker reports and skips such values
        for key, value in logs.items():
            if type(value) in (float, int):
                continue
            try:
                device = getattr(value, "device", None)
                if device is None or device.type != "cuda" or value.numel() != 1:
                    continue
                copy = value.detach().to("cpu", non_blocking=True)  # pinned destination: truly asynchronous
                event = timer.record()
                if event is not None:
                    logs[key] = (copy, event)
            except Exception as exc:
                self.guard.report("log_copy", exc, key)

    def release(self, *events: Any) -> None:
        if self.timer is not None:
            self.timer.release(*events)

    def drop(self, pairs: list[tuple[str, Any, Any]]) -> None:
        if self.timer is not None:
            self.timer.drop(pairs)

    # -- the worker -------------------------------------------------------------------------------
    def gpu_uuids(self) -> list[str]:
        """The UUIDs of the GPUs this rank uses: its device, and any other it has memory on."""
        torch = self.torch
        used = [self.device]
        for i in range(torch.cuda.device_count()):
            if i != self.device and torch.cuda.memory_reserved(i) > 0:
                used.append(i)
        uuids = []
        for i in used:
            uuid = str(torch.cuda.get_device_properties(i).uuid)
            uuids.append(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        return uuids

    def name(self) -> str:
        return str(self.torch.cuda.get_device_properties(self.device).name)
