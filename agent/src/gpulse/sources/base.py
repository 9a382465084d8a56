"""The contract between a GPU source (NVML, simulated) and the agent.

A source produces :class:`Reading` tuples whose field names are ``gpulse.schema`` field names;
the agent adds the per-GPU tags (host, gpu, uuid, model, run) and encodes them. Keeping the
source free of tags and encoding lets the same agent loop run on real and simulated GPUs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class GpuIdentity:
    """What the agent needs to tag a GPU's points."""

    index: int  # NVML index (tag ``gpu``)
    uuid: str  # tag ``uuid``
    model: str  # product name, tag ``model`` (e.g. "NVIDIA H100 80GB HBM3")


class Reading(NamedTuple):
    """One point of one measurement for one GPU, before tags and encoding."""

    measurement: str  # "gpu" | "gpu_info" | "gpu_process" | "gpu_event" | "gpu_nvlink"
    gpu: int  # GPU index the reading belongs to (a MIG device's: its parent's)
    fields: dict[str, Any]  # keys are gpulse.schema field names of that measurement
    ts_ns: int  # Unix ns
    tags: dict[str, str] | None = None  # extra tags beyond host/gpu/uuid/model ({"link": "3"}, {"mig": "1g.18gb/1"})


class SourceUnavailable(Exception):
    """No driver / NVML cannot start; the message says what to do."""


class GpuSource(ABC):
    """A set of GPUs sampled once per agent cycle."""

    @abstractmethod
    def open(self) -> list[GpuIdentity]:
        """Initialise and probe capabilities; raises :class:`SourceUnavailable`."""

    @property
    @abstractmethod
    def gpus(self) -> list[GpuIdentity]:
        """The current GPUs (may change after a driver re-init)."""

    @abstractmethod
    def collect(self, now_ns: int) -> list[Reading]:
        """All readings due at ``now_ns``; never raises.

        One ``gpu`` reading per live GPU per call, all stamped ``now_ns``; ``gpu_info`` readings
        on the first call after open()/re-init; slow tiers (~10 s, ~60 s) merged into that
        cycle's ``gpu`` fields when due; ``gpu_nvlink`` per link ~10 s; ``gpu_process`` ~5 s;
        ``gpu_event`` readings drained from the event thread (with their own timestamps).
        """

    @abstractmethod
    def error_counts(self) -> dict[str, int]:
        """Failed calls by kind (keys from ``gpulse.schema.NVML_ERROR_KINDS``), cumulative."""

    @abstractmethod
    def lost(self) -> set[int]:
        """Indices of GPUs marked lost."""

    @abstractmethod
    def close(self) -> None:
        """Stop threads and release the library; safe to call twice."""

    def fatal(self) -> str | None:
        """Why this source cannot recover in this process (the agent then exits), else None.

        A source never raises out of ``collect``; when only a new process can help (NVML after a
        driver upgrade: the old library stays mapped), it says so here and the agent stops with a
        non-zero exit so that its service manager starts it again."""
        return None
