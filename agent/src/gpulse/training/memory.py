"""CUDA caching-allocator counters per step: allocated, reserved, peak (reset each step), retries.

These are host-side counters of PyTorch's allocator: reading them never waits for the GPU. One
``_cuda_memoryStats`` call per step gives all of them (``torch.cuda.memory_allocated`` and friends
each rebuild the full flattened dict, several times slower).
"""

from __future__ import annotations

from typing import Any


class MemoryProbe:
    """Reads one device's allocator counters and resets its peak at each step boundary."""

    def __init__(self, torch: Any, device: int, reset_peak: bool = True) -> None:
        self.device = device
        self.reset_peak = reset_peak
        cuda = torch.cuda
        raw = getattr(torch._C, "_cuda_memoryStats", None)
        reset = getattr(torch._C, "_cuda_resetPeakMemoryStats", None)
        self._raw = raw
        self._flat = cuda.memory_stats
        self._reset = reset if reset is not None else cuda.reset_peak_memory_stats

    def read(self) -> tuple[int, int, int, int]:
        """``(allocated, reserved, peak allocated since the last read, alloc retries so far)``."""
        dev = self.device
        if self._raw is not None:
            s = self._raw(dev)
            alloc = s["allocated_bytes"]["all"]
            out = (
                alloc["current"],
                s["reserved_bytes"]["all"]["current"],
                alloc["peak"],
                s.get("num_alloc_retries", 0),
            )
        else:
            f = self._flat(dev)
            out = (
                f.get("allocated_bytes.all.current", 0),
                f.get("reserved_bytes.all.current", 0),
                f.get("allocated_bytes.all.peak", 0),
                f.get("num_alloc_retries", 0),
            )
        if self.reset_peak:
            self._reset(dev)
        return out
