"""Who this process is in its job: rank, local rank, world size, the run id all ranks share, the tags.

The run id must be identical on every rank of every node without a collective on the training
path: an explicit id, else one the launcher already put in the environment (``GPULSE_RUN_ID``,
``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``), else one rank 0 generates and shares through the
process group's key-value store (and exports as ``GPULSE_RUN_ID`` for child processes). Every point
of the run carries its tags: up to :data:`MAX_USER_TAGS` of the user's, then ``run``, ``rank``,
``local_rank`` and ``world_size``, and in a Slurm job its ``job`` (the id the agent finds in the
rank's cgroup, so training points and the GPU's points share it).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from gpulse.training.errors import Guard

MAX_USER_TAGS = 8
#: The agent's tags: the identity above, and the job tags it reads from the kernel (``schema.JOB_TAGS``; the
#: agent refuses a point that names ``account`` or the like, by which a route picks a team's database).
RESERVED_TAGS = (
    "host",
    "run",
    "rank",
    "local_rank",
    "world_size",
    "job",
    "job_user",
    "account",
    "partition",
    "pod",
    "namespace",
)
#: Longest tag value (the schema's limit; the agent rejects longer ones).
MAX_TAG_VALUE = 256
_TAG_KEY = r"[A-Za-z0-9_.\-]{1,64}"  # a pattern string: ``re`` compiles it on first use

_runs_created = 0
#: The id this process generated and exported for its previous run (not to be reused by the next one).
_exported_run_id: str | None = None


def _env_int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        v = env.get(name)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def dist_identity(env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from torch.distributed when initialised, else launcher env."""
    env = os.environ if env is None else env
    rank = _env_int(env, "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
    local = _env_int(env, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
    world = _env_int(env, "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    dist = initialized_dist()
    if dist is not None:
        rank, world = dist.get_rank(), dist.get_world_size()
    rank = rank or 0
    return rank, (local if local is not None else rank), max(world or 1, 1)


def initialized_dist() -> Any:
    """``torch.distributed`` if it is already imported and initialised (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        return None
    return None


def env_run_id(env: Mapping[str, str] | None = None) -> str | None:
    """A job-wide run id from the environment: ``GPULSE_RUN_ID``, ``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``."""
    env = os.environ if env is None else env
    if env.get("GPULSE_RUN_ID"):
        return env["GPULSE_RUN_ID"]
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic.lower() != "none":  # torchrun's default --rdzv-id is the literal "none"
        return elastic
    job = env.get("SLURM_JOB_ID")
    if job:
        step = env.get("SLURM_STEP_ID")
        return f"slurm-{job}" + (f".{step}" if step else "")
    return None


def generate_run_id(name: str | None) -> str:
    # never a leading "-" (a name that is an absolute path, as ms-swift's, would give one): such an id
    # reads as an option on a command line (``gpulse report --run -tmp-...``)
    stem = re.sub(r"[^A-Za-z0-9_.\-]", "-", name or "run").lstrip("-.")[:48] or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"


def share_run_id(dist: Any, rank: int, candidate: str, guard: Guard, timeout_s: float = 10.0) -> str:
    """Rank 0's run id for every rank, through the process group's key-value store.

    A store (not a collective) so that a rank that never creates a Run cannot deadlock the others;
    a rank that waits in vain falls back to its own id after ``timeout_s``.
    """
    global _runs_created
    _runs_created += 1
    key = f"gpulse/run_id/{_runs_created}"
    try:
        from datetime import timedelta

        store = dist.distributed_c10d._get_default_store()
        if rank == 0:
            store.set(key, candidate)
            return candidate
        store.wait([key], timedelta(seconds=timeout_s))
        return store.get(key).decode()
    except Exception as exc:
        guard.report("run_id_share", exc, "using a rank-local run id")
        return candidate


def resolve_run_id(explicit: str | None, name: str, rank: int, world_size: int, guard: Guard) -> str:
    """The run id: explicit, else from the launcher's environment, else generated (and shared by rank 0)."""
    global _exported_run_id
    rid = explicit or env_run_id()
    if rid and rid != _exported_run_id:  # an id this process exported belongs to its previous run
        return str(rid)[:MAX_TAG_VALUE]
    rid = generate_run_id(name)
    dist = initialized_dist()
    if dist is not None and world_size > 1:
        rid = share_run_id(dist, rank, rid, guard)
    os.environ["GPULSE_RUN_ID"] = _exported_run_id = rid  # processes started from here join this run
    return rid


def run_tags(
    user: Mapping[str, Any] | None, run_id: str, rank: int, local_rank: int, world_size: int, guard: Guard
) -> dict[str, str]:
    """The tags of every point of the run: the user's (checked, at most :data:`MAX_USER_TAGS`), then the identity."""
    tags = {}
    for key, value in (user or {}).items():
        key = str(key)
        if key in RESERVED_TAGS or not re.fullmatch(_TAG_KEY, key):
            guard.report("bad_tag", detail=f"tag {key!r} is reserved or not [A-Za-z0-9_.-]{{1,64}}; dropped")
            continue
        if len(tags) >= MAX_USER_TAGS:
            guard.report("too_many_tags", detail=f"at most {MAX_USER_TAGS} user tags; {key!r} dropped")
            continue
        text = str(value)[:MAX_TAG_VALUE]
        if text:
            tags[key] = text
    tags.update(run=run_id, rank=str(rank), local_rank=str(local_rank), world_size=str(world_size))
    job = os.environ.get("SLURM_JOB_ID", "")
    if job.isdigit():  # the job the agent attributes this rank's GPU processes to, from their cgroup
        tags["job"] = job
    return tags
