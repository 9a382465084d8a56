"""MIG: the devices of a MIG-enabled GPU, each sampled on its own and tagged ``mig``.

On a GPU in MIG mode the parent answers no utilisation ("On MIG-enabled GPUs, querying device
utilization rates is not currently supported"), no per-process utilisation, no GPM of its own, and
gives memory and process lists only "if the caller has appropriate privileges" (NVML reference,
nvmlDeviceGetMemoryInfo / nvmlDeviceGetComputeRunningProcesses_v3). Per-instance figures come from
MIG device handles (``nvmlDeviceGetMigDeviceHandleByIndex``): memory and processes per instance,
and GPM per GPU instance through ``nvmlGpmMigSampleGet(parent, gpuInstanceId, ...)``.

The ``mig`` tag is ``<profile>/<index>``, e.g. ``1g.18gb/1`` for "MIG 1g.18gb Device 1" in
``nvidia-smi -L``. The profile is the driver's own name: the GPU instance profile
(``nvmlDeviceGetGpuInstanceProfileInfoV``, unprivileged, unlike ``nvmlDeviceGetGpuInstanceById``
which "Requires privileged user") whose slice count and memory match the MIG device's attributes
(``nvmlDeviceGetAttributes_v2``); a compute instance smaller than its GPU instance gets the ``Nc.``
prefix as NVIDIA's go-nvlib writes it (``pkg/nvlib/device/mig_profile.go``). Two profiles with the
same slices and memory (``1g.18gb`` and ``1g.18gb+me``) cannot be told apart from the attributes;
the first one is named.

The MIG layout is read when NVML is (re)initialised. A reconfiguration while the agent runs needs
no process on those instances anyway; their old handles then fail ("the MIG device handle would
remain invalid and must be requested again") and are counted as errors until the agent restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpulse.sources.nvml import errors as E
from gpulse.sources.nvml import gpm as nvml_gpm

Collector = Callable[[Any, dict[str, Any]], None]


class InstanceProfile(NamedTuple):
    slices: int
    memory_mib: int
    name: str  # "1g.18gb" (the driver's "MIG 1g.18gb" without the prefix)


@dataclass
class MigPlan:
    """One MIG device of a GPU: what its cycle reads."""

    index: int  # MIG device index under the parent
    gpu_instance: int
    compute_instance: int
    profile: str
    uuid: str
    handle: Any
    memory: Collector | None = None
    gpm: nvml_gpm.GpmSampler | None = None
    proc_lists: list[Callable[[Any], Any]] = field(default_factory=list)
    supported: set[str] = field(default_factory=set)

    @property
    def tag(self) -> str:
        return f"{self.profile}/{self.index}"

    @property
    def tags(self) -> dict[str, str]:
        return {"mig": self.tag}

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()
            self.gpm = None


def profile_name(gi_slices: int, ci_slices: int, memory_mib: int, profiles: list[InstanceProfile]) -> str:
    """The MIG profile of a device from its attributes and the GPU's instance profiles."""
    same = [p for p in profiles if p.slices == gi_slices]
    if same:
        base = min(same, key=lambda p: abs(p.memory_mib - memory_mib)).name
    else:  # no profile table: an approximation in the driver's form
        base = f"{gi_slices}g.{round(memory_mib / 1024)}gb"
    return base if ci_slices in (0, gi_slices) else f"{ci_slices}c.{base}"


def instance_profiles(nv: Any, parent: Any, call_ok: Callable[..., tuple[bool, Any]]) -> list[InstanceProfile]:
    """The GPU instance profiles the parent offers (``nvidia-smi mig -lgip``)."""
    get = getattr(nv, "nvmlDeviceGetGpuInstanceProfileInfo", None)
    out: list[InstanceProfile] = []
    if get is None:
        return out
    for pid in range(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0)):
        ok, info = call_ok(nv, lambda pid=pid: get(parent, pid, 2))
        if ok and info is not None:
            name = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
            out.append(InstanceProfile(int(info.sliceCount), int(info.memorySizeMB), name.removeprefix("MIG ")))
    return out


def probe_migs(
    nv: Any,
    parent: Any,
    call_ok: Callable[..., tuple[bool, Any]],
    memory: Callable[[Any, Any], Collector | None],
    gpm_clock: Callable[[], int] | None,
) -> list[MigPlan]:
    """Every MIG device of ``parent`` with its memory collector, GPM sampler (when ``gpm_clock``
    is given) and process lists. Lost GPU / dead driver errors propagate like any probe call."""
    ok, count = call_ok(nv, lambda: nv.nvmlDeviceGetMaxMigDeviceCount(parent))
    if not ok or not count:
        return []
    profiles = instance_profiles(nv, parent, call_ok)
    plans: list[MigPlan] = []
    for index in range(int(count)):
        ok, handle = call_ok(nv, lambda index=index: nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, index))
        if not ok or handle is None:  # NotFound: an empty slot
            continue
        gi = int(nv.nvmlDeviceGetGpuInstanceId(handle))
        ci = int(nv.nvmlDeviceGetComputeInstanceId(handle))
        attrs = nv.nvmlDeviceGetAttributes_v2(handle)
        name = profile_name(
            int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount), int(attrs.memorySizeMB), profiles
        )
        uuid = str(nv.nvmlDeviceGetUUID(handle))
        plan = MigPlan(index, gi, ci, name, uuid, handle, memory=memory(nv, handle))
        if plan.memory is not None:
            scratch: dict[str, Any] = {}
            call_ok(nv, lambda m=plan.memory, h=handle, out=scratch: m(h, out))
            plan.supported.update(scratch)
        if gpm_clock is not None:
            try:
                plan.gpm = nvml_gpm.GpmSampler(nv, handle, nvml_gpm.mig_sample_get(nv, parent, gi), clock_ns=gpm_clock)
                plan.supported.update(nvml_gpm.FIELDS)
            except E.nvml_errors(nv) as e:
                if E.outcome_of(E.code_of(e)) is not E.ReadOutcome.OK:
                    raise
        for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            f = getattr(nv, fn_name, None)
            if f is not None and call_ok(nv, lambda f=f, handle=handle: f(handle))[0]:
                plan.proc_lists.append(f)
        plans.append(plan)
    return plans
