"""GPU checks: the agent's GPU source with what each GPU supports, and whether containers can see them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from gpulse.cli.checks.base import Check, Context, Result, fail, ok, skip

DRIVER_FIX = (
    "install the NVIDIA driver until `nvidia-smi` works; inside a container, start it with the GPUs "
    "(`--gpus all`, or the compose profile `agent`)"
)


def _ranges(indices: list[int]) -> str:
    """``0-3,6`` for [0, 1, 2, 3, 6]."""
    out: list[str] = []
    start = prev = None
    for i in sorted(indices):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)


def no_gpu_fix() -> str:
    from gpulse.agent.loop import NO_GPU_WAY_OUT

    return f"{DRIVER_FIX}; {NO_GPU_WAY_OUT}; or leave the GPUs out of this check: `gpulse doctor --skip gpus`"


def check_gpus(ctx: Context) -> Result:
    """Open the agent's GPU source, read one cycle, and list what each GPU supports and whether its
    process list can be read. Without NVML the doctor accepts an agent on the socket that runs
    simulated GPUs (the one no-GPU story); ``agent --check`` asks about this configuration only."""
    from gpulse.agent.loop import make_source, unavailable_reason
    from gpulse.sources.base import SourceUnavailable

    cfg = ctx.cfg
    name = "gpus"
    try:
        source = make_source(cfg)
        gpus = source.open()
    except SourceUnavailable as e:
        ctx.nvml_ok = False
        return _without_nvml(ctx, unavailable_reason(e))
    except Exception as e:  # an unexpected library error is a finding, not a crash
        return fail(name, f"NVML failed: {type(e).__name__}: {e}", DRIVER_FIX)
    try:
        readings = source.collect(time.time_ns())
    finally:
        source.close()
    if not gpus:
        return fail(name, "NVML works but lists no GPU", "check `nvidia-smi -L`; in a container, pass the GPUs in")
    ctx.real_gpus = 0 if cfg.simulate else len(gpus)
    ctx.nvml_ok = ctx.nvml_ok or not cfg.simulate
    infos = {r.gpu: r.fields for r in readings if r.measurement == "gpu_info" and not r.tags}
    groups: dict[tuple[str, str, str], list[int]] = {}
    for g in gpus:
        info = infos.get(g.index, {})
        key = (g.model, str(info.get("supported_metrics", "")), str(info.get("unsupported_metrics", "")))
        groups.setdefault(key, []).append(g.index)
    first = infos.get(gpus[0].index, {})
    kind = f"simulated (--simulate {cfg.simulate})" if cfg.simulate else "NVML"
    versions = ", ".join(
        f"{label} {first[k]}" for label, k in (("driver", "driver_version"), ("CUDA", "cuda_version")) if first.get(k)
    )
    lines = [f"{len(gpus)} GPU(s) via {kind}" + (f" ({versions})" if versions else "")]
    for (model, supported, unsupported), idx in groups.items():
        n_sup = len([m for m in supported.split(",") if m])
        missing = [m for m in unsupported.split(",") if m]
        text = f"GPU {_ranges(idx)} {model}: {n_sup} metrics"
        text += f"; not supported: {', '.join(missing)}" if missing else "; every metric supported"
        lines.append(text)
    lines += _process_access(infos)
    return ok(name, "\n    ".join(lines))


def _process_access(infos: dict[int, dict[str, Any]]) -> list[str]:
    """One line per kind of process-list access other than "ok" (e.g. a MIG parent needs privileges)."""
    from gpulse.sources.nvml.probe import PROCESS_ACCESS_ADVICE

    by_access: dict[str, list[int]] = {}
    for index, info in infos.items():
        access = str(info.get("process_access") or "")
        if access and access != "ok":
            by_access.setdefault(access, []).append(index)
    return [f"GPU {_ranges(idx)}: {PROCESS_ACCESS_ADVICE.get(a, a)}" for a, idx in sorted(by_access.items())]


def _without_nvml(ctx: Context, why: str) -> Result:
    if ctx.live:
        status, _ = ctx.running_agent()
        source = str((status or {}).get("source") or "")
        if source.startswith("simulated"):
            n = len(status.get("gpus") or []) if status else 0
            return ok(
                "gpus",
                f"no NVIDIA driver here ({why}); the agent on {ctx.cfg.socket_path} runs {n} {source} GPU(s)",
            )
    return fail("gpus", f"NVML unavailable: {why}", no_gpu_fix())


# -- containers -------------------------------------------------------------------------------------
def _in_container() -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    try:
        with open("/proc/1/cgroup", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    return any(k in text for k in ("docker", "containerd", "kubepods", "libpod"))


def _host_pid_namespace() -> bool:
    """In the host's PID namespace, PID 1 is the init system, not the container's entrypoint."""
    try:
        with open("/proc/1/comm", encoding="utf-8") as f:
            return f.read().strip() in ("systemd", "init", "launchd", "runit", "s6-svscan")
    except OSError:
        return False


CDI_SPECS = ("/etc/cdi", "/var/run/cdi")
TOOLKIT_FIX = (
    "install the NVIDIA Container Toolkit, then `sudo nvidia-ctk runtime configure --runtime=docker && "
    "sudo systemctl restart docker`; check with `docker run --rm --gpus all ubuntu nvidia-smi`"
)


def containers(
    have_gpus: bool,
    *,
    simulated: bool = False,
    docker_info: Callable[[], dict[str, Any]] | None = None,
    in_container: bool | None = None,
    host_pid: bool | None = None,
) -> Result:
    """Can containers see the GPUs? Inside one: the GPUs and the host PID namespace are there; with a
    reachable Docker engine: it has the NVIDIA runtime (or CDI specs) to pass GPUs in."""
    name = "containers"
    if simulated:
        return skip(name, "simulated GPUs, nothing for containers to see")
    inside = _in_container() if in_container is None else in_container
    if inside:
        if not have_gpus:  # the gpus check already says how to pass them in
            return skip(name, "inside a container without GPUs: see the gpus check")
        if not (_host_pid_namespace() if host_pid is None else host_pid):
            return fail(
                name,
                "inside a container with its own PID namespace: GPU processes show as unknown PIDs",
                "run the agent container with `pid: host` (the compose profile `agent` does)",
            )
    elif not have_gpus:
        return skip(name, "no GPU on this host, so nothing for containers to see")
    try:
        info = (docker_info or _docker_info)()
    except Exception as e:  # docker not installed, socket absent, permission denied
        if inside:
            return ok(name, "inside a container that sees the GPUs, in the host PID namespace")
        return skip(name, f"no Docker engine reachable ({type(e).__name__}), containers not checked")
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    cdi = [d for d in CDI_SPECS if os.path.isdir(d) and any(f.startswith("nvidia") for f in os.listdir(d))]
    version = info.get("ServerVersion", "")
    if "nvidia" in runtimes or cdi:
        how = "the nvidia runtime" if "nvidia" in runtimes else f"CDI specs in {', '.join(cdi)}"
        return ok(
            name, f"Docker {version} can pass GPUs to containers ({how}; default runtime {info.get('DefaultRuntime')})"
        )
    return fail(name, f"Docker {version} has no NVIDIA runtime (runtimes: {', '.join(runtimes)})", TOOLKIT_FIX)


def _docker_info() -> dict[str, Any]:
    import docker

    client = docker.from_env(timeout=3)
    try:
        return client.info()
    finally:
        client.close()


GPUS = Check("gpus", check_gpus)
CONTAINERS = Check("containers", lambda ctx: containers(ctx.real_gpus > 0, simulated=bool(ctx.cfg.simulate)))
