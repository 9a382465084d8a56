"""Snapshots of other projects' repositories (a bare git directory each, named ``owner+name/repo``), for the
tests that check a citation against the cited file at the cited commit.

They are read from ``GPULSE_SOURCE_SNAPSHOTS`` (by default ``/work/.mirror``, where the ``fetch`` tool puts
them). Without the repository, or without the commit in it, such a test is skipped and says which; the
checks then run where the record was made and wherever a snapshot is put.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SNAPSHOTS = Path(os.environ.get("GPULSE_SOURCE_SNAPSHOTS", "/work/.mirror"))


def snapshot(repo: str, commit: str) -> Path:
    """The git directory of ``repo`` ("owner/name") holding ``commit``; the test is skipped without one."""
    where = SNAPSHOTS / repo.replace("/", "+") / "repo"
    if not (where / "HEAD").exists():
        pytest.skip(f"no snapshot of {repo} at {where} (GPULSE_SOURCE_SNAPSHOTS names where they are)")
    if subprocess.run(
        ["git", "-C", str(where), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    ).returncode:
        pytest.skip(f"commit {commit} of {repo} is not in the snapshot at {where}")
    return where


def show(snapshot_dir: Path, commit: str, path: str) -> str | None:
    """The file ``path`` at ``commit`` (``None`` where the commit has no such file)."""
    done = subprocess.run(["git", "-C", str(snapshot_dir), "show", f"{commit}:{path}"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None
