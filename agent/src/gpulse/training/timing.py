"""GPU phase times from pooled CUDA events, read without ever waiting for the GPU.

``torch.cuda.Event.elapsed_time`` raises unless both events have completed, and
``synchronize()`` would stall the training loop, so the training thread only *records* events
(cheap, asynchronous) and the run's background thread reads a step's events once every end
event's ``query()`` is true. Events are reused from a bounded pool: when the pool is empty
(the GPU is far behind), a phase simply gets no GPU time.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class CudaTimer:
    """A bounded pool of timing-enabled CUDA events, shared by the training and background threads."""

    def __init__(self, torch: Any, capacity: int = 512) -> None:
        self._event_cls = torch.cuda.Event
        self._free: deque[Any] = deque()  # deque append/pop are atomic: no lock between the two threads
        self._created = 0
        self.capacity = capacity
        self.exhausted = 0

    def record(self) -> Any:
        """An event recorded now on the current stream, or ``None`` when the pool is used up."""
        try:
            ev = self._free.pop()
        except IndexError:
            if self._created >= self.capacity:
                self.exhausted += 1
                return None
            self._created += 1
            ev = self._event_cls(enable_timing=True)
        ev.record()
        return ev

    def release(self, *events: Any) -> None:
        for ev in events:
            if ev is not None:
                self._free.append(ev)

    @staticmethod
    def ready(pairs: list[tuple[str, Any, Any]], extra: list[Any] = ()) -> bool:  # type: ignore[assignment]
        """True once every event has completed (``query()`` never blocks)."""
        for _, start, end in pairs:
            if not (end.query() and start.query()):
                return False
        return all(ev.query() for ev in extra)

    def read(self, pairs: list[tuple[str, Any, Any]]) -> dict[str, float]:
        """Seconds per phase name (summed over repeats); call only after :meth:`ready`. Returns events to the pool."""
        out: dict[str, float] = {}
        try:
            for name, start, end in pairs:
                out[name] = out.get(name, 0.0) + start.elapsed_time(end) / 1000.0
        finally:
            self.drop(pairs)
        return out

    def drop(self, pairs: list[tuple[str, Any, Any]]) -> None:
        """Give a step's events back without reading them (step emitted without GPU times)."""
        for _, start, end in pairs:
            self._free.append(start)
            self._free.append(end)
