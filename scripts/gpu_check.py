"""``make gpu-check``: prove gpulse on this machine's NVIDIA GPUs, offline, in a few minutes.

It loads every GPU with a bf16 matmul loop (CUDA torch), runs the real ``gpulse agent`` against a
``--record`` file (no database, no network) with its training socket open, drives a few training
steps through ``gpulse.training`` with CUDA events on GPU 0, and then checks what the agent wrote:

* ``load``: a matmul loop runs on every GPU (no load, no proof: it fails);
* ``metrics_seen``: every metric ``gpu_info`` says the GPU supports was seen, with a plausible value;
* ``utilisation``: GPU busy time high under load; ``sm_activity``: GPM SM activity high (GPM GPUs);
* ``memory``: memory used equals the baseline plus the load process's memory, within 3 %, and that
  process's memory is torch's reserved memory plus a CUDA context (under 3 GiB);
* ``power``: power within the enforced limit; ``energy``: the energy counter grows by power x time
  within 15 %;
* ``load_process``: the load's PID is in ``gpu_process`` with at least torch's reserved memory;
* ``nvml_errors``: 0 failed NVML calls; ``skipped_cycles``: 0 skipped cycles;
* ``cycle_time``: the sampling cycle's wall time (per GPU in the summary) never reached the interval;
* ``training_step``: ``train_step`` points with CUDA-event phase times, and GPU 0 tagged with the run.

Every check prints PASS, FAIL or SKIP (with why); every figure goes to the JSON summary
(``--summary``, default ``gpu-check-summary.json``), with one more: what "KB" means in
``nvmlDeviceGetPcieThroughput`` (``pcie_kb``: its 20 ms readings against the PCIe byte counter
during host-to-device copies). Exit 0 only when no check failed. Without an
NVIDIA driver or without a CUDA build of torch in this Python it says so in one sentence, exit 1.
How to run it on a machine without network: ``scripts/GPU-CHECK.md``.

Usage: python scripts/gpu_check.py [--duration S] [--interval S] [--keep DIR] [--summary FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30

# One process per GPU: prints its pid and torch's reserved memory once the first matmul finished.
LOAD = r"""
import json, os, sys, time, torch
dev = torch.device(f"cuda:{int(sys.argv[1])}")
seconds = float(sys.argv[2])
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
(a @ b).sum().item()
torch.cuda.synchronize(dev)
print(json.dumps({"pid": os.getpid(), "gpu": int(sys.argv[1]), "reserved": torch.cuda.memory_reserved(dev)}), flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize(dev)
"""

# A few training steps on GPU 0 through gpulse.training, phases timed with CUDA events.
TRAIN = r"""
import json, sys, torch
from gpulse.training import Run
sock, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
dev = torch.device("cuda:0")
model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(64, 4096, device=dev)
run = Run(name="gpu-check", output_dir=out, socket_path=sock)
for _ in range(steps):
    with run.step(samples=64, tokens=64):
        with run.phase("forward"):
            loss = model(x).pow(2).mean()
        with run.phase("backward"):
            loss.backward()
        with run.phase("optimizer"):
            opt.step()
            opt.zero_grad()
    run.log(loss=loss.detach())
run.finish()
print(json.dumps({"run_id": run.run_id, "steps": steps}), flush=True)
"""


# Host-to-device copies on GPU 0, for the PCIe unit measurement (pinned memory, 256 MiB at a time).
COPY = r"""
import sys, time, torch
dev = torch.device("cuda:0")
src = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
dst = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
dst.copy_(src, non_blocking=True)
torch.cuda.synchronize(dev)
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(dev)
"""


@dataclass
class Check:
    name: str
    status: str  # "pass" | "fail" | "skip"
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Load:
    """What the load process on one GPU reported."""

    gpu: int
    pid: int
    reserved: int


@dataclass
class Recorded:
    """The agent's record file, by measurement: (tags, fields, ts) per point."""

    points: dict[str, list[tuple[dict[str, str], dict[str, Any], int]]]
    bad_lines: int

    def gpu(self, index: int, measurement: str = "gpu") -> list[tuple[dict[str, str], dict[str, Any], int]]:
        """The points of one GPU itself (not its MIG devices), oldest first."""
        rows = [p for p in self.points.get(measurement, []) if p[0].get("gpu") == str(index) and "mig" not in p[0]]
        return sorted(rows, key=lambda p: p[2])

    def values(self, index: int, name: str) -> list[Any]:
        return [f[name] for _, f, _ in self.gpu(index) if name in f]


def read_record(path: Path) -> Recorded:
    from gpulse.lineprotocol.parse import LineError, read_lines

    points: dict[str, list[tuple[dict[str, str], dict[str, Any], int]]] = defaultdict(list)
    bad = 0
    for _no, _text, p in read_lines(path):
        if isinstance(p, LineError):
            bad += 1
        else:
            points[p.measurement].append((p.tags, p.fields, p.ts or 0))
    return Recorded(dict(points), bad)


#: Plausible range of a gpu field by its schema unit (a value outside means a wrong read or unit).
_RANGES: dict[str, tuple[float, float]] = {
    "%": (0, 100),
    "°C": (1, 125),
    "W": (1, 2000),
    "MHz": (1, 20000),
    "0/1": (0, 1),
    "P-state": (0, 15),
    "gen": (1, 7),
    "lanes": (1, 32),
}


def plausible(name: str, value: Any) -> bool:
    from gpulse.schema import GPU

    f = GPU.by_name.get(name)
    if f is None or isinstance(value, str):
        return False
    lo, hi = _RANGES.get(f.unit, (0, float("inf")))
    return lo <= float(value) <= hi


def _median(values: Iterable[float]) -> float | None:
    v = [float(x) for x in values]
    return statistics.median(v) if v else None


def analyse(
    rec: Recorded,
    n_gpus: int,
    loads: dict[int, Load],
    baseline_used: dict[int, int],
    final: dict[str, Any],
    interval_s: float,
    train: dict[str, Any] | None,
) -> list[Check]:
    """Every check of the module docstring, from what the agent recorded and what the loads reported."""
    checks: list[Check] = []
    gpus = range(n_gpus)

    def add(name: str, failures: list[str], ok_detail: str, skip: str | None = None, **figures: Any) -> None:
        if skip is not None:
            checks.append(Check(name, "skip", skip, figures))
        else:
            checks.append(Check(name, "fail" if failures else "pass", "; ".join(failures) or ok_detail, figures))

    missing = [i for i in gpus if i not in loads]
    add("load", [f"no load ran on GPU {i}" for i in missing], f"a matmul loop on each of {n_gpus} GPU(s)")
    infos = {i: next((f for _, f, _ in reversed(rec.gpu(i, "gpu_info"))), {}) for i in gpus}

    bad: list[str] = []
    seen_counts: dict[int, int] = {}
    for i in gpus:
        supported = [m for m in str(infos[i].get("supported_metrics", "")).split(",") if m]
        if not supported:
            bad.append(f"GPU {i}: no gpu_info with supported metrics was recorded")
        seen_counts[i] = len(supported)
        for name in supported:
            values = rec.values(i, name)
            if not values:
                bad.append(f"GPU {i}: {name} supported but never seen")
            elif not all(plausible(name, v) for v in values):
                bad.append(f"GPU {i}: {name} implausible ({min(values)}..{max(values)})")
    add("metrics_seen", bad, "every supported metric seen with plausible values", supported=seen_counts)

    util = {i: _median(rec.values(i, "util_gpu_pct")) for i in gpus}
    low = [f"GPU {i}: median util {u}" for i, u in util.items() if u is None or u < 80]
    add("utilisation", low, "median util_gpu_pct >= 80 % on every GPU", util_gpu_pct_median=util)

    sm = {i: _median(rec.values(i, "sm_active_pct")) for i in gpus if "sm_active_pct" in str(infos[i])}
    low = [f"GPU {i}: median SM activity {v}" for i, v in sm.items() if v is None or v < 50]
    add(
        "sm_activity",
        low,
        "median sm_active_pct >= 50 % on every GPM GPU",
        skip=None if sm else "no GPU with GPM (SM activity needs Hopper or later)",
        sm_active_pct_median=sm,
    )

    mem_fail, mem_fig = [], {}
    for i, load in loads.items():
        used = _median(rec.values(i, "mem_used_bytes"))
        procs = [f for _, f, _ in rec.gpu(i, "gpu_process") if f.get("pid") == load.pid and "mem_used_bytes" in f]
        proc_mem = _median(f["mem_used_bytes"] for f in procs)
        base = baseline_used.get(i, 0)
        mem_fig[i] = {"used": used, "baseline": base, "load_process": proc_mem, "torch_reserved": load.reserved}
        if used is None or proc_mem is None:
            mem_fail.append(f"GPU {i}: memory or the load's process memory not recorded")
            continue
        context = proc_mem - load.reserved
        mem_fig[i]["context"] = context
        if not 0 < context < 3 * GIB:
            mem_fail.append(f"GPU {i}: load process {proc_mem:.0f} B vs torch reserved {load.reserved} B")
        if abs(used - (base + proc_mem)) > 0.03 * used + (64 << 20):
            mem_fail.append(f"GPU {i}: used {used:.0f} B, expected baseline {base} + load {proc_mem:.0f} B (3 %)")
    add("memory", mem_fail, "used = baseline + torch reserved + context, within 3 %", memory=mem_fig)

    pw_fail, pw_fig = [], {}
    for i in gpus:
        power = rec.values(i, "power_w")
        limit = _median(rec.values(i, "power_limit_w")) or infos[i].get("power_limit_w")
        pw_fig[i] = {"median_w": _median(power), "max_w": max(power) if power else None, "limit_w": limit}
        if not power or not limit:
            pw_fail.append(f"GPU {i}: power or its limit not recorded")
        elif statistics.median(power) > limit or max(power) > 1.1 * limit:
            pw_fail.append(f"GPU {i}: power median {statistics.median(power)} W, max {max(power)} W, limit {limit} W")
    add("power", pw_fail, "median power <= limit, peaks <= 1.1 x limit", power=pw_fig)

    en_fail, en_fig = [], {}
    for i in gpus:
        rows = [(ts, f["energy_mj"], f.get("power_w")) for _, f, ts in rec.gpu(i) if "energy_mj" in f]
        if len(rows) < 2:
            en_fail.append(f"GPU {i}: fewer than two energy readings")
            continue
        (t0, e0, _), (t1, e1, _) = rows[0], rows[-1]
        watts = (e1 - e0) / 1000 / ((t1 - t0) / 1e9)
        mean_power = statistics.fmean(p for _, _, p in rows if p is not None)
        en_fig[i] = {"from_energy_w": watts, "mean_power_w": mean_power}
        if e1 <= e0 or abs(watts - mean_power) > 0.15 * mean_power + 5:
            en_fail.append(f"GPU {i}: energy gives {watts:.1f} W, power readings {mean_power:.1f} W")
    add("energy", en_fail, "energy counter grows by power x time (15 %)", energy=en_fig)

    pid_fail = []
    for i, load in loads.items():
        rows = [f for _, f, _ in rec.gpu(i, "gpu_process") if f.get("pid") == load.pid]
        if not rows:
            pid_fail.append(f"GPU {i}: load pid {load.pid} not in gpu_process")
        elif max(f.get("mem_used_bytes", 0) for f in rows) < load.reserved:
            pid_fail.append(f"GPU {i}: load pid {load.pid} shows less memory than torch reserved")
    add("load_process", pid_fail, "every load's PID is listed with its memory")

    agents = sorted(rec.points.get("agent", []), key=lambda p: p[2])
    last = agents[-1][1] if agents else {}
    errors = {k.removeprefix("nvml_errors_"): v for k, v in last.items() if k.startswith("nvml_errors_")}
    add(
        "nvml_errors",
        [f"{n} failed NVML call(s): {k}" for k, n in errors.items() if n] or ([] if agents else ["no agent point"]),
        "0 failed NVML calls",
        nvml_errors=errors,
    )
    skipped = final.get("cycles_skipped")
    add("skipped_cycles", [f"{skipped} cycle(s) skipped"] if skipped != 0 else [], "0 skipped cycles", skipped=skipped)

    walls = [f["cycle_ms"] for _, f, _ in agents if "cycle_ms" in f]
    fig = {
        "cycle_ms_median": _median(walls),
        "cycle_ms_max": max(walls) if walls else None,
        "cycle_ms_per_gpu_median": (_median(walls) or 0) / max(n_gpus, 1) if walls else None,
        "cycle_cpu_ms": final.get("cycle_cpu_ms"),
    }
    slow = [f"the cycle took {max(walls):.1f} ms of a {interval_s * 1e3:.0f} ms interval"] if walls and max(walls) >= interval_s * 1e3 else []  # fmt: skip
    add(
        "cycle_time",
        slow if walls else ["no cycle time recorded"],
        f"cycle wall {fig['cycle_ms_per_gpu_median']} ms per GPU",
        **fig,
    )

    if train is None:
        add("training_step", ["the training script did not run"], "")
    else:
        steps = [f for t, f, _ in rec.points.get("train_step", []) if t.get("run") == train.get("run_id")]
        gpu_timed = [f for f in steps if f.get("forward_gpu_s", 0) > 0 and f.get("backward_gpu_s", 0) > 0]
        tagged = any(t.get("run") == train.get("run_id") for t, _, _ in rec.gpu(0))
        fails = [] if len(gpu_timed) >= max(1, len(steps) // 2) and steps else [f"{len(gpu_timed)} of {len(steps)} steps with CUDA-event times"]  # fmt: skip
        if not tagged:
            fails.append("GPU 0 points were not tagged with the run")
        add("training_step", fails, f"{len(steps)} train_step points, CUDA-event phase times", steps=len(steps))
    return checks


# -- running it --------------------------------------------------------------------------------------
def fail(msg: str) -> int:
    print(f"gpu-check: {msg}", file=sys.stderr)
    return 1


def nvml_gpus() -> tuple[list[str], str, dict[int, int]]:
    """GPU names, the driver version and each GPU's memory used now, or ([], reason, {})."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py (import pynvml) is not installed", {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return [], f"no NVIDIA driver is usable on this machine (NVML: {e})", {}
    try:
        names, used = [], {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            names.append(str(pynvml.nvmlDeviceGetName(h)))
            used[i] = int(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used)
        return names, str(pynvml.nvmlSystemGetDriverVersion()), used
    finally:
        pynvml.nvmlShutdown()


def cuda_torch_problem(python: str, env: dict[str, str]) -> str | None:
    """None when ``python`` has a CUDA build of torch that sees a GPU, else why not (one sentence)."""
    probe = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda, torch.cuda.is_available()]))"
    r = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    if r.returncode != 0:
        return (
            f"{python} has no torch; run gpu-check with a Python that has a CUDA build of torch (PY=/usr/bin/python3)"
        )
    version, cuda, available = json.loads(r.stdout.strip().splitlines()[-1])
    if not cuda:
        return f"torch {version} in {python} is a CPU build; use the machine's CUDA torch (PY=/usr/bin/python3)"
    if not available:
        return f"torch {version} (CUDA {cuda}) in {python} sees no GPU (torch.cuda.is_available() is False)"
    return None


def pcie_unit(env: dict[str, str], seconds: float = 3.0) -> dict[str, Any]:
    """What "KB" means in ``nvmlDeviceGetPcieThroughput``: its 20 ms readings during steady
    host-to-device copies against the PCIe RX byte counter (field 198) over the same time.
    A figure for the summary, not a check: a ratio near 1000 or 1024 settles the unit."""
    import pynvml

    copy = subprocess.Popen([sys.executable, "-c", COPY, str(seconds + 2)], stdout=subprocess.PIPE, text=True, env=env)
    pynvml.nvmlInit()
    try:
        if (copy.stdout.readline() if copy.stdout else "").strip() != "ready":
            return {"skipped": "the copy load did not start"}
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        time.sleep(0.3)

        def counter() -> tuple[int, int] | None:
            v = pynvml.nvmlDeviceGetFieldValues(h, [(198, 0)])[0]  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
            return (int(v.value.ullVal), int(v.timestamp)) if v.nvmlReturn == 0 else None

        first, windows, end = counter(), [], time.monotonic() + seconds
        if first is None:
            return {"skipped": "this GPU has no PCIe byte counters (field 198)"}
        while time.monotonic() < end:
            windows.append(pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES))
        last = counter()
        assert last is not None
        rate = (last[0] - first[0]) * 1e6 / max(last[1] - first[1], 1)
        kb = statistics.fmean(windows)
        ratio = rate / kb if kb else None
        verdict = "inconclusive"
        for unit in (1000, 1024):
            if ratio and abs(ratio - unit) / unit < 0.01:
                verdict = f"KB = {unit} bytes"
        return {"counter_rx_bytes_per_s": rate, "window_rx_kb_per_s": kb, "bytes_per_kb": ratio, "verdict": verdict}
    finally:
        pynvml.nvmlShutdown()
        stop([copy])


def start_loads(n: int, seconds: float, env: dict[str, str]) -> tuple[list[subprocess.Popen[str]], dict[int, Load]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", LOAD, str(i), str(seconds)], stdout=subprocess.PIPE, text=True, env=env)
        for i in range(n)
    ]
    loads: dict[int, Load] = {}
    for p in procs:  # each prints once its first matmul finished (CUDA init takes a few seconds)
        line = p.stdout.readline() if p.stdout else ""
        try:
            d = json.loads(line)
            loads[d["gpu"]] = Load(d["gpu"], d["pid"], d["reserved"])
        except (ValueError, KeyError):
            pass
    return procs, loads


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=40.0, help="agent run under load, s (default 40)")
    ap.add_argument("--interval", type=float, default=0.5, help="sampling interval, s (default 0.5)")
    ap.add_argument("--summary", type=Path, default=Path("gpu-check-summary.json"), help="the JSON summary")
    ap.add_argument("--keep", metavar="DIR", help="keep the record file, agent log and training output in DIR")
    args = ap.parse_args()
    t_start = time.monotonic()

    names, driver, baseline = nvml_gpus()
    if not names:
        return fail(f"{driver}; nothing to check (run this on a machine with an NVIDIA GPU).")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    src = str(REPO / "agent" / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    sys.path.insert(0, src)
    problem = cuda_torch_problem(sys.executable, env)
    if problem:
        return fail(f"{problem}; without a load there is nothing to prove.")
    print(f"gpu-check: {len(names)} GPU(s), driver {driver}: {', '.join(sorted(set(names)))}; Python {sys.executable}")

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpulse-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    record, log_path, sock = work / "record.lp", work / "agent.log", work / "agent.sock"
    procs, loads = start_loads(len(names), args.duration + 60, env)
    print(f"gpu-check: load: bf16 8192x8192 matmul loop on {len(loads)} of {len(names)} GPU(s)")
    cmd = [sys.executable, "-m", "gpulse", "agent", "--record", str(record), "--duration", str(args.duration)]
    cmd += ["--interval", str(args.interval), "--socket", str(sock), "--spool-dir", str(work / "spool")]
    cmd += ["--self-metrics-interval", "2", "--host", "gpu-check", "--summary-file", str(work / "summary.json")]
    print(f"gpu-check: running {' '.join(cmd[1:])}")
    train: dict[str, Any] | None = None
    final: dict[str, Any] = {}
    try:
        with open(log_path, "w") as log:
            agent = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
            time.sleep(min(5.0, args.duration / 4))
            t = subprocess.run(
                [sys.executable, "-c", TRAIN, str(sock), str(work / "train"), "30"],
                capture_output=True, text=True, env=env, timeout=max(60.0, args.duration),
            )  # fmt: skip
            if t.returncode == 0:
                train = json.loads(t.stdout.strip().splitlines()[-1])
            else:
                print(t.stderr[-2000:], file=sys.stderr)
            rc = agent.wait(timeout=args.duration + 60)
    finally:
        stop(procs)
    log_text = log_path.read_text(errors="replace")
    summary = work / "summary.json"
    final = json.loads(summary.read_text()) if summary.exists() else {}
    if rc != 0 or not final:
        print(log_text[-3000:], file=sys.stderr)
        return fail(f"the agent exited with code {rc} (log above, also in {log_path}).")

    rec = read_record(record)
    checks = analyse(rec, len(names), loads, baseline, final, args.interval, train)
    try:
        pcie = pcie_unit(env)
    except Exception as e:  # a figure, not a check: its failure must not hide the checks' verdict
        pcie = {"skipped": f"{type(e).__name__}: {e}"}
    print(f"gpu-check: PCIe throughput unit: {pcie.get('verdict', pcie.get('skipped'))} {pcie}")
    if rec.bad_lines:
        checks.append(Check("record_file", "fail", f"{rec.bad_lines} unparsable line(s) in {record}"))
    ok = not any(c.status == "fail" for c in checks)
    summary = {
        "ok": ok,
        "gpus": names,
        "driver": driver,
        "python": sys.executable,
        "duration_s": round(time.monotonic() - t_start, 1),
        "interval_s": args.interval,
        "agent_final": final,
        "points": {m: len(p) for m, p in rec.points.items()},
        "pcie_kb": pcie,
        "checks": [asdict(c) for c in checks],
    }
    args.summary.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    for c in checks:
        print(f"  {c.status.upper():4s} {c.name}: {c.detail}")
    ran = sum(c.status != "skip" for c in checks)
    print(
        f"gpu-check: {'OK' if ok else 'FAILED'}: {ran} checks ran, {len(checks) - ran} skipped, summary in {args.summary}"
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
