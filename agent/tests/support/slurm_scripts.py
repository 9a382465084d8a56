"""The real ``deploy/slurm`` prolog and epilog, run with the environment slurmd gives them.

slurmd starts a Prolog or Epilog with an environment of its own making, not its own environment
(``src/plugins/prep/script/prep_script_slurmd.c``, ``_build_env``: ``env_array_create()``, then
``setenvf`` of each variable), so the scripts run here under ``env -i`` with only:

* ``SLURM_JOB_ID`` and its older name ``SLURM_JOBID``, ``SLURM_JOB_UID``, ``SLURM_JOB_USER`` (``cred_arg->id->pw_name``),
  ``SLURM_JOB_ACCOUNT`` and ``SLURM_JOB_PARTITION`` (from the job's credential),
  ``SLURM_SCRIPT_CONTEXT`` (``prolog_slurmd`` / ``epilog_slurmd``): ``_build_env``;
* ``SLURM_JOB_GPUS`` (Slurm's GPU indices, comma-separated) and ``CUDA_VISIBLE_DEVICES`` (the same
  indices, or the GPUs' unique ids where gres.conf gives them): ``gres_job_env``, merged into that
  environment, as ``src/plugins/gres/common/gres_common.c`` ``gres_common_prep_set_env`` writes it.

``epilog.sh`` is a link to ``prolog.sh``: one script, which does the epilog's part when
``SLURM_SCRIPT_CONTEXT`` says so. ``GPULSE_SLURM_JOB_DIR`` is the one variable slurmd would not pass: it points the scripts at a test's
directory instead of ``/run/gpulse/slurm-jobs`` (sites change the default in the installed copy).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from support.fixtures import REPO

PROLOG = REPO / "deploy" / "slurm" / "prolog.sh"
EPILOG = REPO / "deploy" / "slurm" / "epilog.sh"


@dataclass(frozen=True)
class Job:
    id: str
    user: str
    uid: int
    account: str
    partition: str
    gpus: tuple[int, ...]


def environment(job: Job, context: str, job_dir: Path, **more: str) -> dict[str, str]:
    """What slurmd sets for ``job``'s prolog (``context`` ``prolog_slurmd``) or epilog (``epilog_slurmd``)."""
    gpus = ",".join(map(str, job.gpus))
    env = {
        "SLURM_JOB_ID": job.id,
        "SLURM_JOBID": job.id,
        "SLURM_JOB_UID": str(job.uid),
        "SLURM_JOB_USER": job.user,
        "SLURM_JOB_ACCOUNT": job.account,
        "SLURM_JOB_PARTITION": job.partition,
        "SLURM_SCRIPT_CONTEXT": context,
        "GPULSE_SLURM_JOB_DIR": str(job_dir),
        **more,
    }
    if gpus:
        env |= {"SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus}
    return env


def command(script: Path, env: dict[str, str]) -> list[str]:
    """``script`` run by ``/bin/sh`` as slurmd runs it: a fresh environment, no search path of its own."""
    return ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "/bin/sh", str(script)]


def run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(script, env), capture_output=True, text=True, timeout=30)


def prolog(job: Job, job_dir: Path, **more: str) -> subprocess.CompletedProcess[str]:
    return run(PROLOG, environment(job, "prolog_slurmd", job_dir, **more))


def epilog(job: Job, job_dir: Path, **more: str) -> subprocess.CompletedProcess[str]:
    return run(EPILOG, environment(job, "epilog_slurmd", job_dir, **more))


def files(job_dir: Path) -> dict[str, str]:
    """Every file the scripts left that a reader sees (not their lock or temporary files)."""
    return {p.name: p.read_text() for p in sorted(job_dir.iterdir()) if not p.name.startswith(".")}
