"""A profiler trace read back into the few figures a finding needs as evidence.

The input is the gzipped Chrome trace ``torch.profiler`` writes (``export_chrome_trace``): ``X``
events with a start (``ts``) and a duration (``dur``), both in microseconds, on threads of a
process. Standard library only (``json`` + ``gzip``): this runs inside the training process.

* top operators by self time: an operator's duration less that of the operators it called
  (CPU ops nest on their thread); GPU kernels do not nest, their self time is their duration;
* communication against compute: kernels named like NCCL or gloo (the pattern Holistic Trace
  Analysis classifies as communication, ``hta/common/types.py``) against the other kernels; a trace
  without kernels (a CPU run) classifies the outermost CPU ops and gloo's annotated collectives the
  same way, with ``torch.distributed``'s own ops (``c10d::*``) as communication;
* DataLoader wait: the ranges ``torch.utils.data`` records around each ``__next__`` of its
  iterators (``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``, ...).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from typing import Any

#: Communication kernels and ops, as HTA names them (plus gloo, the CPU backend).
COMM_PATTERN = re.compile(r"^nccl|ncclKernel|gloo")
#: On a CPU run (no kernels): also the CPU side of ``torch.distributed``'s ops (``c10d::allreduce_``, ...).
CPU_COMM_PATTERN = re.compile(COMM_PATTERN.pattern + r"|^c10d::")
#: Memory copies and sets: neither communication nor compute (HTA's MEMORY class).
MEMORY_PATTERN = re.compile(r"^Memcpy|^Memset|^dma")
#: The range the DataLoader iterator records around each batch it hands over.
DATALOADER_PATTERN = re.compile(r"^enumerate\(DataLoader\)#.*__next__$")
STEP_PATTERN = re.compile(r"^ProfilerStep#\d+$")
#: Operators named in a summary.
TOP_N = 5


class TopOp:
    """One operator's self time over the window, and how often it ran."""

    __slots__ = ("calls", "device", "name", "self_ms")

    def __init__(self, name: str, device: str, self_ms: float, calls: int) -> None:
        self.name = name
        self.device = device
        self.self_ms = self_ms
        self.calls = calls

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "device": self.device, "self_ms": round(self.self_ms, 3), "calls": self.calls}


class TraceSummary:
    """What a profiler window showed: the slowest operators, communication against compute, data wait."""

    __slots__ = ("comm_ms", "compute_ms", "dataloader_wait_ms", "steps", "top_ops", "window_ms")

    def __init__(
        self, steps: int, window_ms: float, top_ops: list[TopOp], comm_ms: float, compute_ms: float,
        dataloader_wait_ms: float,
    ) -> None:  # fmt: skip
        self.steps = steps
        self.window_ms = window_ms
        self.top_ops = top_ops
        self.comm_ms = comm_ms
        self.compute_ms = compute_ms
        self.dataloader_wait_ms = dataloader_wait_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "window_ms": round(self.window_ms, 3),
            "top_ops": [op.to_json() for op in self.top_ops],
            "comm_ms": round(self.comm_ms, 3),
            "compute_ms": round(self.compute_ms, 3),
            "dataloader_wait_ms": round(self.dataloader_wait_ms, 3),
        }

    def text(self) -> str:
        """One line for an annotation or a log."""
        ops = ", ".join(f"{op.name} {op.self_ms:.1f} ms" for op in self.top_ops[:3]) or "no operators"
        return (
            f"{self.steps} steps in {self.window_ms:.1f} ms; top self time: {ops}; "
            f"communication {self.comm_ms:.1f} ms vs compute {self.compute_ms:.1f} ms; "
            f"DataLoader wait {self.dataloader_wait_ms:.1f} ms"
        )


def load_trace(path: str) -> dict[str, Any]:
    """A Chrome trace file, gzipped (``.gz``) or not."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        trace: dict[str, Any] = json.load(fh)
    if not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path} is no Chrome trace: it has no traceEvents list")
    return trace


def summarise(trace: dict[str, Any], top_n: int = TOP_N) -> TraceSummary:
    """The summary of a loaded trace (:func:`load_trace`)."""
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]
    steps = [e for e in spans if STEP_PATTERN.match(str(e.get("name", "")))]
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    cpu_ops = [e for e in spans if e.get("cat") == "cpu_op"]
    self_us: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    for e, own in _self_times(cpu_ops):
        key = (str(e["name"]), "cpu")
        self_us[key] += own
        calls[key] += 1
    for e in kernels:
        key = (str(e["name"]), "cuda")
        self_us[key] += e["dur"]
        calls[key] += 1
    # on a GPU the kernels are where the time goes; on a CPU, the ops
    ranked = sorted(self_us, key=lambda k: (k[1] != ("cuda" if kernels else "cpu"), -self_us[k]))
    top = [TopOp(name, dev, self_us[(name, dev)] / 1000, calls[(name, dev)]) for name, dev in ranked[:top_n]]
    if kernels:
        classified, comm_re = kernels, COMM_PATTERN
    else:  # a CPU run: gloo's collectives run as annotated ranges on its own threads
        comm_re = CPU_COMM_PATTERN
        annotated = [e for e in spans if e.get("cat") == "user_annotation" and comm_re.search(str(e["name"]))]
        classified = _outermost(cpu_ops + annotated)
    comm = sum(e["dur"] for e in classified if comm_re.search(str(e["name"])))
    compute = sum(
        e["dur"] for e in classified if not comm_re.search(str(e["name"])) and not MEMORY_PATTERN.match(str(e["name"]))
    )
    wait = sum(e["dur"] for e in spans if DATALOADER_PATTERN.match(str(e.get("name", ""))))
    window = sum(e["dur"] for e in steps)
    return TraceSummary(len(steps), window / 1000, top, comm / 1000, compute / 1000, wait / 1000)


def _by_thread(events: list[dict[str, Any]]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    """Events per (pid, tid), sorted by start, the longer first where two start together (the parent)."""
    threads: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        threads[(e.get("pid"), e.get("tid"))].append(e)
    for evs in threads.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    return threads


def _self_times(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """Each event with its self time: its duration less its direct children's (nesting per thread)."""
    out: list[tuple[dict[str, Any], float]] = []
    for evs in _by_thread(events).values():
        own = [float(e["dur"]) for e in evs]
        stack: list[int] = []  # indices of the open ancestors
        for i, e in enumerate(evs):
            while stack and evs[stack[-1]]["ts"] + evs[stack[-1]]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                own[stack[-1]] -= e["dur"]
            stack.append(i)
        out += [(e, max(t, 0.0)) for e, t in zip(evs, own, strict=True)]
    return out


def _outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events no other event on their thread contains (so that nothing is counted twice)."""
    out: list[dict[str, Any]] = []
    for evs in _by_thread(events).values():
        end = float("-inf")
        for e in evs:
            if e["ts"] >= end:
                out.append(e)
                end = e["ts"] + e["dur"]
    return out
