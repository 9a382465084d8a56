"""In a Slurm job every point of a rank carries the job id the agent finds in the rank's cgroup.

The agent tags the GPU processes of job 4242 with ``job=4242`` from ``/proc/PID/cgroup``; the rank
tags its own points from ``SLURM_JOB_ID``, which Slurm sets to the same id (for a SLUID cgroup
directory, too: the agent maps the SLUID to this id). The tag is the schema's, not one of the
user's eight.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulse import schema
from gpulse.channel.validate import check_tags
from gpulse.training import Run


def make_run(tmp_path: Path, **kw) -> Run:
    run = Run(output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), write_report=False, **kw)
    run.finish()
    return run


def test_a_rank_in_a_slurm_job_tags_its_points_with_the_job_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("GPULSE_RUN_ID", "pretrain-7")
    assert make_run(tmp_path).tags["job"] == "4242"


def test_outside_a_job_there_is_no_job_tag_and_a_users_job_tag_is_refused(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run = make_run(tmp_path, tags={"job": "mine", "team": "vision"})
    assert "job" not in run.tags and run.tags["team"] == "vision"
    assert set(run.stats()["errors"]) == {"bad_tag"}


def test_the_agent_accepts_the_job_tag_beside_eight_user_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    run = make_run(tmp_path, tags={f"t{i}": i for i in range(8)})
    for m in (schema.TRAIN_STEP, schema.TRAIN_RUN, schema.TRAIN_EVENT):
        assert check_tags(m, run.tags) == run.tags
