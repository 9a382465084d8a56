"""The automatic profiler window: a few steps of ``torch.profiler`` when a finding asks for them.

A finding that is raised and stays calls :meth:`ProfileWindow.request` from the background worker.
That only marks a window pending and adds a step-end hook (``StepRecorder.on_step_end``): the
training thread pays nothing until a window is asked for. The hook, on the training thread at a
step boundary, starts ``torch.profiler.profile`` with the schedule ``warmup=1, active=3``, calls
``step()`` at each step end (which marks ``ProfilerStep#N``) and ``stop()`` once the schedule has
saved its trace, then removes itself. Nothing here waits for the GPU: the profiler collects its
CUDA activity itself, and gpulse never synchronises.

The trace goes to ``<output_dir>/gpulse-profiles/`` as a gzipped Chrome trace, with the
``distributedInfo`` torch adds when ``torch.distributed`` is initialised (Holistic Trace Analysis
reads the rank from it; Perfetto opens the file). A thread of its own then reads it back
(:mod:`gpulse.training.trace_summary`), so that parsing a large trace never stalls a step; for a
data-loading finding it also records one ``py-spy dump`` of the DataLoader workers where py-spy
is installed and allowed to attach, and otherwise says what would allow it. Each finished window
becomes a :class:`Profile`: in ``metrics_report.json`` (``profiles``), as a ``train_event``
(``kind=profile``: the annotation) and to the ``on_profile`` listeners (the finding's evidence).

Bounded: one window at a time, at most one per rule per hour, and none once the profiles directory
holds ``max_bytes``. ``Run(profile=False)`` or ``GPULSE_PROFILE=0`` turns it off.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpulse.training.errors import Guard
from gpulse.training.step import StepRecorder

PROFILE_ENV = "GPULSE_PROFILE"
PROFILES_DIR = "gpulse-profiles"
#: Disk the profiles directory may hold before windows are skipped.
DEFAULT_MAX_BYTES = 200 << 20
#: A rule gets at most one window per this many seconds.
PER_RULE_S = 3600.0
#: The profiler's schedule: one warm-up step (its events are dropped), then the steps recorded.
WARMUP_STEPS = 1
ACTIVE_STEPS = 3
#: Rules whose window also dumps the DataLoader workers' stacks with py-spy.
DATA_LOADING_RULES = frozenset({"data_loading"})
PYSPY_TIMEOUT_S = 20.0
#: The ``profile`` field of a profile's ``train_event``: at most this long (the schema's string limit is
#: 4096), each text in it at most :data:`TEXT_IN_POINT`.
POINT_JSON_MAX = 4000
TEXT_IN_POINT = 600
#: What allows py-spy to attach, said where it could not.
PTRACE_ADVICE = (
    "run the training as root, or start its container with --cap-add SYS_PTRACE "
    "(Kubernetes: securityContext.capabilities.add: [SYS_PTRACE]), or set kernel.yama.ptrace_scope=0"
)


def profiling_enabled(profile: bool) -> bool:
    """``Run(profile=...)`` unless ``GPULSE_PROFILE`` says ``0`` (or ``false``/``off``/``no``)."""
    return profile and os.environ.get(PROFILE_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


class Profile:
    """One finished profiler window: the rule that asked for it, its trace and what the trace shows."""

    __slots__ = ("error", "evidence", "path", "pyspy", "pyspy_path", "rank", "rule", "steps", "summary")

    def __init__(self, rule: str, evidence: str, rank: int, path: str, steps: list[int]) -> None:
        self.rule = rule
        self.evidence = evidence
        self.rank = rank
        self.path = path
        #: the run's step numbers the window recorded
        self.steps = steps
        self.summary: Any = None  # a TraceSummary once read back
        #: the py-spy dump, or why there is none (:func:`pyspy_note`; ``None`` where the rule does not ask for one)
        self.pyspy: str | None = None
        #: the file the dump was saved to, beside the trace (``None``: no dump)
        self.pyspy_path: str | None = None
        self.error: str | None = None

    def text(self) -> str:
        """The annotation's text: what the window showed and where its trace (and py-spy dump) is."""
        what = self.summary.text() if self.summary is not None else f"trace not readable: {self.error}"
        dump = f"; py-spy dump {self.pyspy_path}" if self.pyspy_path else ""
        return f"profile for {self.rule}: {what}; trace {self.path}{dump}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "evidence": self.evidence,
            "rank": self.rank,
            "path": self.path,
            "steps": self.steps,
            "summary": self.summary.to_json() if self.summary is not None else None,
            "pyspy": self.pyspy,
            "pyspy_path": self.pyspy_path,
            "error": self.error,
        }

    def point_json(self, limit: int = POINT_JSON_MAX) -> str:
        """The window as the ``train_event`` point's ``profile`` field: :meth:`to_json` within ``limit``
        characters (a point's string field is bounded): the dump itself stays in its file, long
        texts are cut, and operators are dropped from the end until it fits."""
        d = self.to_json()
        if self.pyspy_path:
            d["pyspy"] = None
        for key in ("evidence", "pyspy", "error"):
            if isinstance(d[key], str):
                d[key] = d[key][:TEXT_IN_POINT]
        ops = d["summary"]["top_ops"] if d["summary"] is not None else []
        for op in ops:
            op["name"] = op["name"][: TEXT_IN_POINT // 4]
        text = _json(d)
        while len(text) > limit and ops:
            ops.pop()
            text = _json(d)
        return text


class ProfileWindow:
    """Records a bounded ``torch.profiler`` window when asked; see the module's docstring."""

    def __init__(
        self,
        steps: StepRecorder,
        guard: Guard,
        output_dir: str,
        rank: int = 0,
        *,
        enabled: bool = True,
        max_bytes: int = DEFAULT_MAX_BYTES,
        per_rule_s: float = PER_RULE_S,
        mark: Callable[[str, str], None] | None = None,  # (annotation text, the point's ``profile`` JSON)
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.steps = steps
        self.guard = guard
        self.dir = os.path.join(output_dir, PROFILES_DIR)
        self.rank = rank
        self.enabled = enabled
        self.max_bytes = max_bytes
        self.per_rule_s = per_rule_s
        self.mark = mark
        self.clock = clock
        #: called with each finished :class:`Profile`, on the thread that read it back
        self.on_profile: list[Callable[[Profile], None]] = []
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._busy = False  # a window pending, open, or being read back
        self._request: tuple[str, str] | None = None
        self._prof: Any = None
        self._calls = 0
        self._first_step = 0
        self._exported = False
        self._reader: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """Whether a window is pending, open, or its trace being read back."""
        return self._busy

    # -- the worker thread ----------------------------------------------------------------------
    def request(self, rule: str, evidence: str) -> bool:
        """Ask for a window for ``rule`` (``evidence``: why); whether one will be recorded.

        False when profiling is off, torch is not imported, a window is already under way, the rule
        had one within ``per_rule_s``, or the profiles directory is full (said once, in the log)."""
        if not self.enabled or sys.modules.get("torch") is None:
            return False
        with self._lock:
            last = self._last.get(rule)
            if self._busy or (last is not None and self.clock() - last < self.per_rule_s):
                return False
            used = _dir_bytes(self.dir)
            if used >= self.max_bytes:
                self.guard.report(
                    "profile_disk_cap",
                    detail=f"{self.dir} holds {used} bytes, the cap is {self.max_bytes}: no profiler window "
                    f"for {rule}; remove old traces or raise run.profile_window.max_bytes",
                )
                return False
            self._busy = True
            self._last[rule] = self.clock()
            self._request = (rule, evidence)
        self.steps.on_step_end(self._at_step_end)
        return True

    # -- the training thread, at step ends ---------------------------------------------------------
    def _at_step_end(self) -> None:
        """Start the profiler at the first step end, step it at the next ones, stop it when saved."""
        try:
            if self._prof is None:
                self._start()
                return
            self._calls += 1
            self._prof.step()
            if self._calls >= WARMUP_STEPS + ACTIVE_STEPS:  # the schedule has saved its trace
                self._end()
                if not self._exported:  # torch gave no trace: the next finding may ask again
                    self.guard.report("profile_window", detail="the profiler saved no trace")
                    self._release()
        except Exception as exc:
            self.guard.report("profile_window", exc, "profiler window abandoned")
            try:
                self._end()
            except Exception:
                self._prof = None
            self._release()

    def _start(self) -> None:
        torch = sys.modules["torch"]
        if _profiler_running(torch):  # per thread: seen here, on the training thread, not in request()
            rule, _ = self._request or ("", "")
            self.guard.report(
                "profile_user_profiler", detail=f"the script's own profiler is running: no window for {rule}"
            )
            self._end()
            self._release()
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._first_step = self.steps.step_no + 2  # this step ends now; the next one is the warm-up
        self._calls = 0
        self._exported = False
        prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=WARMUP_STEPS, active=ACTIVE_STEPS, repeat=1),
            on_trace_ready=self._export,
            record_shapes=False,
        )
        rule, _ = self._request or ("", "")
        prof.preset_metadata_json("gpulse", _json({"rule": rule, "rank": self.rank}))  # kept in the trace
        self._prof = prof
        prof.start()

    def _end(self) -> None:
        """Stop the profiler (if started) and take the hook out; the hook list is replaced, not changed,
        since the recorder is iterating it."""
        prof, self._prof = self._prof, None
        self.steps.step_end_hooks = [h for h in self.steps.step_end_hooks if h != self._at_step_end]
        if prof is not None:
            prof.stop()

    def _export(self, prof: Any) -> None:
        """``on_trace_ready``: write the trace, then read it back on a thread of its own."""
        rule, evidence = self._request or ("", "")
        os.makedirs(self.dir, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        path = os.path.join(self.dir, f"{_safe(rule)}-rank{self.rank}-{stamp}-{os.getpid()}.pt.trace.json.gz")
        prof.export_chrome_trace(path)  # the .gz suffix gzips it
        self._exported = True
        first = self._first_step + WARMUP_STEPS
        profile = Profile(rule, evidence, self.rank, path, list(range(first, first + ACTIVE_STEPS)))
        self._reader = threading.Thread(target=self._read_back, args=(profile,), name="gpulse-profile", daemon=True)
        self._reader.start()

    # -- the reader thread --------------------------------------------------------------------------
    def _read_back(self, profile: Profile) -> None:
        from gpulse.training.trace_summary import load_trace, summarise

        try:
            profile.summary = summarise(load_trace(profile.path))
        except Exception as exc:  # a trace torch wrote that we cannot read: keep its path
            profile.error = f"{type(exc).__name__}: {exc}"
            self.guard.report("profile_summary", exc)
        if profile.rule in DATA_LOADING_RULES:
            dumps, problems = pyspy_dumps(os.getpid())
            if dumps:
                profile.pyspy_path = _save_dump(profile.path, pyspy_text(dumps, problems), self.guard)
            profile.pyspy = pyspy_note(dumps, problems, saved=profile.pyspy_path is not None)
        try:
            if self.mark is not None:
                self.mark(profile.text(), profile.point_json())
            for listener in list(self.on_profile):
                listener(profile)
        except Exception as exc:
            self.guard.report("profile_listener", exc)
        self._release()

    def _release(self) -> None:
        with self._lock:
            self._busy = False
            self._request = None

    def close(self, timeout: float = 60.0) -> None:
        """At ``finish()``: stop a window still open (its trace is saved only if it was recording) and
        wait for the trace being read back, so that the report has it."""
        if self._prof is not None:
            try:
                self._end()
            except Exception as exc:
                self.guard.report("profile_window", exc)
        reader = self._reader
        if reader is not None:
            reader.join(timeout)


def pyspy_dumps(pid: int) -> tuple[list[str], list[str]]:
    """One ``py-spy dump`` of each DataLoader worker of ``pid`` (its child processes; ``pid`` itself
    when it has none: with ``num_workers=0`` the loading runs there): the dumps taken, and for each
    process without one, why and what would allow it."""
    import shutil
    import subprocess

    exe = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if exe is None:
        return [], ["py-spy is not installed: pip install py-spy in the training environment to record the DataLoader workers' stacks"]  # fmt: skip
    dumps: list[str] = []
    problems: list[str] = []
    for p in child_pids(pid) or [pid]:
        try:  # --nonblocking: the training process itself is never paused for it
            done = subprocess.run(
                [exe, "dump", "--nonblocking", "--pid", str(p)], capture_output=True, text=True, timeout=PYSPY_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"pid {p}: py-spy dump failed: {exc}")
            continue
        if done.returncode == 0:
            dumps.append(done.stdout.strip())
        else:
            why = (done.stderr or done.stdout).strip().splitlines()
            problems.append(f"pid {p}: py-spy could not attach ({why[-1] if why else done.returncode}); to allow it, {PTRACE_ADVICE}")  # fmt: skip
    return dumps, problems


def pyspy_text(dumps: list[str], problems: list[str]) -> str:
    """:func:`pyspy_dumps`'s parts as one text (a window's ``pyspy``): the dumps, then the problems."""
    return "\n\n".join(dumps + problems)


def pyspy_note(dumps: list[str], problems: list[str], *, saved: bool) -> str:
    """A window's ``pyspy`` as the reports show it beside ``pyspy_path``: why no dump was taken ("none: ..."),
    or the dump itself where its file could not be written; the whole text where it was saved (the point
    then carries the path instead)."""
    text = pyspy_text(dumps, problems)
    if not dumps:
        return f"none: {text}"
    return text if saved else f"not saved to a file: {text}"


def _save_dump(trace: str, text: str, guard: Guard) -> str | None:
    """The py-spy dump into a file beside its trace; its path (``None`` if it could not be written)."""
    path = re.sub(r"\.pt\.trace\.json\.gz$", "", trace) + ".pyspy.txt"
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    except OSError as exc:
        guard.report("profile_pyspy_write", exc)
        return None
    return path


def child_pids(pid: int) -> list[int]:
    """The child processes of ``pid``, from ``/proc/<pid>/task/*/children`` (no psutil in training)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                found += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue
    return sorted(set(found))


def _profiler_running(torch: Any) -> bool:
    """Whether a profiler runs on this thread already (a second one would end the first's session)."""
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except Exception:  # another torch: without the flag, assume none
        return False


def _dir_bytes(path: str) -> int:
    """The size of the files directly in ``path`` (0 if it does not exist)."""
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except OSError:
        return 0


def _safe(rule: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", rule)[:64] or "rule"


def _json(value: Any) -> str:
    import json

    return json.dumps(value)
