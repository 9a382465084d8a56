"""Every rank's report rows handed to rank 0 at ``finish()``, so that its ``metrics_report.json`` covers the run.

Through the process group's key-value store, not a collective: a collective needs every rank at
the same point, and ``finish()`` runs wherever a rank ends (from ``atexit`` too, after the group
is destroyed), so one missing rank would hang the others. With the store only rank 0 waits, for
at most ``timeout_s``: each rank announces itself when its run starts and hands its rows over at
its finish; rank 0 waits for the ranks that announced themselves, gives the others a short
grace, and names whoever is missing (the report is then marked partial). The store is taken when
the run starts and kept, so it still works after ``destroy_process_group()``.

The rows go as zlib-compressed JSON, at most :data:`MAX_ROWS` step rows for the whole run (each
rank keeps every n-th of its steps beyond its share); the run totals come from each rank's
``train_run`` end point, which counts every step.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Step rows handed to rank 0 by all ranks together, at most (per rank: this ÷ world size, at least MIN_ROWS).
MAX_ROWS = 200_000
MIN_ROWS = 1_000
#: How long rank 0 waits for ranks that never announced themselves (no gpulse run there, most likely).
GRACE_S = 2.0
#: When rank 0 says that it is waiting.
SAY_WAITING_AFTER_S = 2.0


def rows_per_rank(world: int) -> int:
    """Step rows each rank hands over, so that rank 0 gets at most about :data:`MAX_ROWS`."""
    return max(MIN_ROWS, MAX_ROWS // max(world, 1))


@dataclass
class Gathered:
    """What rank 0 got: the other ranks' rows, and why the report is partial (``None``: it is not)."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    partial_reason: str | None = None


def pack(steps: list[dict[str, Any]], runs: list[dict[str, Any]], events: list[dict[str, Any]]) -> bytes:
    """A rank's rows for rank 0 (its profiler windows travel as its ``train_event`` points)."""
    data = {"steps": steps, "runs": runs, "events": events}
    return zlib.compress(json.dumps(data, default=str).encode(), 6)


def unpack(blob: bytes) -> dict[str, list[dict[str, Any]]]:
    data = json.loads(zlib.decompress(blob))
    return {k: [r for r in data.get(k, []) if isinstance(r, dict)] for k in ("steps", "runs", "events")}


class RankExchange:
    """One run's slot in the store: ``gpulse/report/<run id>/<rank>`` (rows) and ``.../here/<rank>``."""

    def __init__(self, store: Any, run_id: str, rank: int, world: int) -> None:
        self.store = store
        self.prefix = f"gpulse/report/{run_id}"
        self.rank = rank
        self.world = world

    @classmethod
    def capture(cls, dist: Any, run_id: str, rank: int, world: int) -> RankExchange:
        """The default process group's store (call while the group exists). Raises if there is none."""
        return cls(dist.distributed_c10d._get_default_store(), run_id, rank, world)

    def announce(self) -> None:
        """Tell rank 0 that this rank runs gpulse and will hand its rows over."""
        self.store.set(f"{self.prefix}/here/{self.rank}", "1")

    def hand_over(self, blob: bytes) -> None:
        self.store.set(f"{self.prefix}/rows/{self.rank}", blob)

    def collect(self, timeout_s: float, say: Callable[[str], None]) -> Gathered:
        """Rank 0: the other ranks' rows, waiting at most ``timeout_s`` for those that announced themselves."""
        out = Gathered()
        waiting = set(range(1, self.world))
        announced: set[int] = set()
        unreadable: list[str] = []
        start = time.monotonic()
        said = False
        while waiting:
            for r in sorted(waiting):
                if self._has(f"rows/{r}"):
                    waiting.discard(r)
                    try:
                        self._take(r, out)
                    except Exception as exc:
                        unreadable.append(f"rank {r}'s rows could not be read ({type(exc).__name__}: {exc})")
                elif r not in announced and self._has(f"here/{r}"):
                    announced.add(r)
            elapsed = time.monotonic() - start
            if not waiting or elapsed >= timeout_s or (elapsed >= GRACE_S and not waiting & announced):
                break
            if not said and elapsed >= SAY_WAITING_AFTER_S:
                said = True
                say(
                    f"gpulse: rank 0 waits up to {timeout_s:g} s for rank(s) {_ranks(waiting)} to finish, "
                    "to write the run's metrics_report.json (Run(gather_timeout_s=...) sets how long)"
                )
            time.sleep(0.05)
        why = unreadable
        if waiting:
            late = waiting & announced
            never = waiting - announced
            if late:
                why.append(f"rank(s) {_ranks(late)} did not finish within {timeout_s:g} s")
            if never:
                why.append(f"rank(s) {_ranks(never)} ran no gpulse Run (or started it before init_process_group)")
        out.partial_reason = "; ".join(why) or None
        return out

    def _has(self, key: str) -> bool:
        return bool(self.store.check([f"{self.prefix}/{key}"]))

    def _take(self, rank: int, out: Gathered) -> None:
        data = unpack(self.store.get(f"{self.prefix}/rows/{rank}"))
        out.steps += data["steps"]
        out.runs += data["runs"]
        out.events += data["events"]


def _ranks(ranks: set[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))
