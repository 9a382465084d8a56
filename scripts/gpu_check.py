"""``make gpu-check``: run the real agent on this machine's NVIDIA GPUs and show what it sees.

Runs ``gpulse agent`` against a ``--record`` file (no database, no network) for 20 s while a
PyTorch matmul loop loads every GPU, then prints every metric seen (with its range), every metric
the GPUs do not support (from ``gpu_info``), and the agent's CPU time per cycle. Without torch the
agent still runs, on idle GPUs, and says so. Without an NVIDIA driver it says so in one sentence
and exits 1. Unattended; well under 2 minutes.

Usage: python scripts/gpu_check.py [--duration S] [--interval S] [--keep DIR] [--simulate N]
(``--simulate N`` checks this script itself on a machine without a GPU: simulated GPUs, no load.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One process per GPU, so every GPU is loaded; prints "ready" once the first matmul finished.
LOAD = r"""
import sys, time, torch
dev = torch.device(f"cuda:{int(sys.argv[1])}")
seconds = float(sys.argv[2])
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
(a @ b).sum().item()
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize(dev)
"""


def fail(msg: str) -> int:
    print(f"gpu-check: {msg}", file=sys.stderr)
    return 1


def nvml_gpus() -> tuple[list[str], str]:
    """GPU names through NVML, or ([], reason)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py (import pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return [], f"no NVIDIA driver is usable on this machine (NVML: {e})"
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else name)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return names, driver.decode() if isinstance(driver, bytes) else str(driver)
    finally:
        pynvml.nvmlShutdown()


def start_load(n_gpus: int, seconds: float, env: dict[str, str]) -> tuple[list[subprocess.Popen[str]], str]:
    """Matmul loops on every GPU, or ([], why not)."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if probe.returncode != 0:
        return [], "torch is not installed: the agent runs without load (GPUs idle)"
    version, available, count = probe.stdout.split()
    if available != "True":
        return (
            [],
            f"torch {version} has no CUDA here: the agent runs without load (GPUs idle)",
        )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD, str(i), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(min(n_gpus, int(count)))
    ]
    for p in procs:  # wait until each loop runs (CUDA init takes a few seconds)
        line = p.stdout.readline() if p.stdout else ""
        if line.strip() != "ready":
            stop(procs)
            return [], "the torch load did not start: the agent runs without load"
    return procs, f"torch {version}: bf16 8192x8192 matmul loop on {len(procs)} GPU(s)"


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def summarize(
    record: Path,
) -> tuple[
    dict[str, dict[str, list[float | str]]],
    dict[str, int],
    list[dict[str, object]],
    int,
]:
    """Field values seen per measurement, point counts, gpu_info rows, bad lines."""
    from gpulse.lineprotocol.parse import LineError, read_lines

    seen: dict[str, dict[str, list[float | str]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[str, int] = defaultdict(int)
    infos: list[dict[str, object]] = []
    bad = 0
    for _no, _text, p in read_lines(record):
        if isinstance(p, LineError):
            bad += 1
            continue
        counts[p.measurement] += 1
        if p.measurement == "gpu_info":
            infos.append({**p.tags, **p.fields})
        for k, v in p.fields.items():
            seen[p.measurement][k].append(int(v) if isinstance(v, bool) else v)
    return seen, counts, infos, bad


def fmt_range(values: list[float | str]) -> str:
    nums = [v for v in values if not isinstance(v, str)]
    if not nums:
        return repr(str(values[-1])[:60])
    lo, hi = min(nums), max(nums)
    mean = sum(nums) / len(nums)

    def num(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:.6g}"

    return num(lo) if lo == hi else f"min {num(lo)}  mean {mean:.6g}  max {num(hi)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--keep", metavar="DIR", help="keep the record file and agent log in DIR")
    ap.add_argument("--simulate", type=int, metavar="N", help="self-test without a GPU: N simulated GPUs, no load")
    args = ap.parse_args()

    if args.simulate:
        names, driver = [f"simulated {i}" for i in range(args.simulate)], "none (simulated)"
    else:
        names, driver = nvml_gpus()
    if not names:
        return fail(f"{driver}; nothing to check (run this on a machine with an NVIDIA GPU).")
    print(f"gpu-check: {len(names)} GPU(s), driver {driver}: {', '.join(sorted(set(names)))}")

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULSE_")}
    src = str(REPO / "agent" / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    sys.path.insert(0, src)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpulse-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    record, log_path = work / "record.lp", work / "agent.log"

    if args.simulate:
        procs, load_text = [], "none (simulated GPUs)"
    else:
        procs, load_text = start_load(len(names), args.duration + 15, env)
    print(f"gpu-check: load: {load_text}")
    cmd = [
        sys.executable,
        "-m",
        "gpulse",
        "agent",
        "--record",
        str(record),
        "--duration",
        str(args.duration),
    ]
    cmd += [
        "--interval",
        str(args.interval),
        "--no-socket",
        "--spool-dir",
        str(work / "spool"),
    ]
    cmd += ["--self-metrics-interval", "5", "--host", "gpu-check"]
    if args.simulate:
        cmd += ["--simulate", str(args.simulate)]
    print(f"gpu-check: running {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    try:
        with open(log_path, "w") as log:
            rc = subprocess.run(
                cmd,
                check=False,
                stderr=log,
                stdout=log,
                env=env,
                timeout=args.duration + 60,
            ).returncode
    except subprocess.TimeoutExpired:
        rc = -1
    finally:
        stop(procs)
    wall = time.monotonic() - t0
    log_text = log_path.read_text(errors="replace")
    final = next(
        (json.loads(ln)["final"] for ln in reversed(log_text.splitlines()) if ln.startswith('{"final"')),
        None,
    )
    if rc != 0 or final is None:
        print(log_text[-3000:], file=sys.stderr)
        return fail(f"the agent exited with code {rc} after {wall:.1f}s (log above, also in {log_path}).")

    seen, counts, infos, bad = summarize(record)
    print(f"\n== points recorded in {record} ({bad} unparsable lines)")
    for m, n in sorted(counts.items()):
        print(f"  {m:12s} {n}")
    for m in sorted(seen):
        print(f"\n== metrics seen: {m} ({len(seen[m])} fields)")
        for k in sorted(seen[m]):
            print(f"  {k:32s} {fmt_range(seen[m][k])}")
    print("\n== metrics unsupported (from gpu_info)")
    for info in sorted(infos, key=lambda i: int(str(i.get("gpu", 0)))):
        unsupported = str(info.get("unsupported_metrics") or "").split(",")
        print(f"  GPU {info.get('gpu')} {info.get('model')}: {', '.join(u for u in unsupported if u) or 'none'}")
    from gpulse.schema import GPU

    supported = set().union(*(set(str(i.get("supported_metrics", "")).split(",")) for i in infos)) if infos else set()
    never = [f.name for f in GPU.fields if f.name in supported and f.name not in seen.get("gpu", {})]
    if never:
        print(f"  supported but never seen in {args.duration:g}s: {', '.join(never)}")
    print("\n== agent")
    print(
        f"  samples {final['samples']}, cycles skipped {final['cycles_skipped']}, GPUs {final['gpus']} "
        f"(lost {final['gpus_lost']}), lines written {final['lines_written']}"
    )
    print(
        f"  CPU time per cycle: {final['cpu_ms_per_cycle']} ms (whole process, all threads); "
        f"sampling thread alone {final['cycle_cpu_ms']} ms; interval {args.interval:g}s"
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    ok = counts.get("gpu", 0) > 0 and bad == 0
    print(f"\ngpu-check: {'OK' if ok else 'FAILED'} in {wall:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
