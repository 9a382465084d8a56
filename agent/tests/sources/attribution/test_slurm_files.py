"""A Slurm prolog's GPU-to-job mapping gives GPUs their job where the agent cannot see the jobs' processes.

The real ``deploy/slurm/prolog.sh`` and ``epilog.sh`` run with the environment slurmd gives them
(``support/slurm_scripts.py`` cites where each variable comes from); the real agent (loop, NVML
source on the NVML stand-in, process describer, encoder, record sink) reads what they wrote. A GPU
"with no visible process" is one NVML lists none on, or one whose process has a PID this agent's
``/proc`` does not hold (an agent without the host's PID namespace).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

import pytest
from support import cgroups
from support import slurm_scripts as slurm
from support.fake_pynvml import h100
from support.nvml_agent import newest_tags, record_agent

from gpulse.sources.attribution import slurm_files
from gpulse.sources.attribution.cgroup import Attribution, Scheduler
from gpulse.sources.attribution.slurm_files import SlurmJobFiles

ALICE = slurm.Job("11", "alice", 1000, "vision", "gpu", (0, 1))
BOB = slurm.Job("12", "bob", 1001, "nlp", "a100", (1, 2, 3))  # shares GPU 1 with ALICE (sharding)
JOB_KEYS = ("job", "job_user", "account", "partition", "pod", "namespace")


def tags_of(job: slurm.Job) -> dict[str, str]:
    return {"job": job.id, "job_user": job.user, "account": job.account, "partition": job.partition}


def job_tags(tags: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in tags.items() if k in JOB_KEYS}


def invisible_pid() -> int:
    """A PID no process can have (above the kernel's ``pid_max``): a GPU process outside this agent's view."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def run_prologs(job_dir: Path, *jobs: slurm.Job) -> None:
    for job in jobs:
        r = slurm.prolog(job, job_dir)
        assert (r.returncode, r.stderr) == (0, ""), r


def aged(job_dir: Path) -> None:
    """Every file's mtime a minute back, so a rescan may trust it unchanged (see ``_racy``)."""
    past = time.time() - 60
    for p in job_dir.iterdir():
        os.utime(p, (past, past))


# -- the scripts --------------------------------------------------------------------------------


def test_the_prolog_writes_each_gpus_jobs_in_dcgm_exporters_format_and_each_jobs_labels(tmp_path):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE, BOB)
    assert slurm.files(job_dir) == {
        "0": "11\n",
        "1": "11\n12\n",  # two jobs on one GPU: one line each
        "2": "12\n",
        "3": "12\n",
        "job_11": "SLURM_JOB_USER=alice\nSLURM_JOB_UID=1000\nSLURM_JOB_ACCOUNT=vision\nSLURM_JOB_PARTITION=gpu\n",
        "job_12": "SLURM_JOB_USER=bob\nSLURM_JOB_UID=1001\nSLURM_JOB_ACCOUNT=nlp\nSLURM_JOB_PARTITION=a100\n",
    }
    assert oct(job_dir.stat().st_mode & 0o777) == "0o755" and oct((job_dir / "1").stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in job_dir.iterdir() if p.name.startswith(".")] == [".lock"]  # no temporary file left


def test_a_prolog_run_again_for_a_requeued_job_adds_no_second_line(tmp_path):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE, BOB, ALICE)
    assert slurm.files(job_dir)["1"] == "12\n11\n"


def test_the_epilog_removes_only_its_own_jobs_lines_and_files(tmp_path):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE, BOB)
    r = slurm.epilog(ALICE, job_dir)
    assert (r.returncode, r.stderr) == (0, "")
    assert slurm.files(job_dir) == {
        "1": "12\n",  # BOB keeps the GPU they shared
        "2": "12\n",
        "3": "12\n",
        "job_12": "SLURM_JOB_USER=bob\nSLURM_JOB_UID=1001\nSLURM_JOB_ACCOUNT=nlp\nSLURM_JOB_PARTITION=a100\n",
    }
    assert slurm.epilog(BOB, job_dir).returncode == 0
    assert slurm.files(job_dir) == {}


def test_the_epilog_cleans_up_without_slurm_job_gpus_and_after_a_job_that_had_no_gpu(tmp_path):
    """The epilog reads every GPU file, not its environment's GPU list (older Slurm set it for the prolog only)."""
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE)
    no_gpus = slurm.Job(ALICE.id, ALICE.user, ALICE.uid, ALICE.account, ALICE.partition, ())
    assert slurm.epilog(no_gpus, job_dir).returncode == 0
    assert slurm.files(job_dir) == {}
    assert slurm.prolog(slurm.Job("13", "carol", 1002, "ops", "cpu", ()), job_dir).returncode == 0
    assert slurm.files(job_dir) == {}  # a job without a GPU of this node writes nothing


def test_prologs_of_jobs_starting_together_keep_each_others_lines(tmp_path):
    job_dir = tmp_path / "slurm-jobs"
    jobs = [slurm.Job(str(100 + i), f"u{i}", 2000 + i, "acct", "gpu", (0,)) for i in range(8)]
    envs = [slurm.environment(j, "prolog_slurmd", job_dir) for j in jobs]
    procs = [subprocess.Popen(slurm.command(slurm.PROLOG, env), stderr=subprocess.PIPE) for env in envs]
    errors = [p.communicate(timeout=30)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(jobs), errors
    assert sorted(slurm.files(job_dir)["0"].split()) == [j.id for j in jobs]


@pytest.mark.parametrize("strict, status", [("0", 0), ("1", 1)])
def test_a_prolog_that_cannot_write_says_why_and_fails_the_job_only_where_the_site_asks(tmp_path, strict, status):
    bad = slurm.Job("14", "dave", 1003, "ops", "gpu", (0,))
    env = slurm.environment(bad, "prolog_slurmd", tmp_path / "slurm-jobs", GPULSE_SLURM_STRICT=strict)
    env["SLURM_JOB_GPUS"] = "0,gpu:1"
    r = slurm.run(slurm.PROLOG, env)
    assert r.returncode == status
    assert r.stderr == "gpulse-slurm: prolog of job 14: SLURM_JOB_GPUS '0,gpu:1' is not a list of GPU indices; " \
        "nothing done\n"  # fmt: skip
    assert not (tmp_path / "slurm-jobs").exists()
    (tmp_path / "file").write_text("")
    r = slurm.prolog(ALICE, tmp_path / "file" / "slurm-jobs", GPULSE_SLURM_STRICT=strict)
    assert r.returncode == status and "cannot create" in r.stderr and "nothing done" in r.stderr


def test_an_epilog_without_a_job_id_changes_nothing_and_lets_the_node_be(tmp_path):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE)
    before = slurm.files(job_dir)
    env = slurm.environment(ALICE, "epilog_slurmd", job_dir)
    env["SLURM_JOB_ID"] = ""
    r = slurm.run(slurm.EPILOG, env)
    assert r.returncode == 0 and "is not a job id; nothing done" in r.stderr
    assert slurm.files(job_dir) == before


@pytest.mark.parametrize("context", ["prolog_task", ""])
def test_run_as_anything_but_slurmds_prolog_or_epilog_the_script_does_nothing(tmp_path, context):
    """A TaskProlog runs as the job's user, and a script run by hand has no context: neither may add or remove."""
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE)
    before = slurm.files(job_dir)
    env = slurm.environment(BOB, context, job_dir)
    r = slurm.run(slurm.PROLOG, env)
    assert r.returncode == 0 and f"SLURM_SCRIPT_CONTEXT '{context}': run as neither" in r.stderr
    assert slurm.files(job_dir) == before


def test_the_epilog_is_the_prolog_script():
    """One script does both parts, chosen by SLURM_SCRIPT_CONTEXT, so the two cannot drift apart."""
    assert slurm.EPILOG.resolve() == slurm.PROLOG.resolve()


# -- the agent ----------------------------------------------------------------------------------


def test_gpus_carry_the_job_user_account_and_partition_the_prolog_wrote_with_no_visible_process(tmp_path, monkeypatch):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE, BOB)
    unseen = invisible_pid()
    gpus = [h100(0), h100(1), h100(2, compute_procs=[(unseen, 1 << 30)]), h100(3), h100(4)]

    points = record_agent(tmp_path, monkeypatch, gpus, None, ["--slurm-job-dir", str(job_dir)])

    held = {g: job_tags(t) for g, t in newest_tags(points, "gpu").items()}
    assert held == {
        "0": tags_of(ALICE),
        "1": {},  # shared by two jobs: no one holder
        "2": tags_of(BOB),
        "3": tags_of(BOB),
        "4": {},  # nobody's
    }
    process = [p for p in points if p.measurement == "gpu_process"][-1]
    assert process.fields["pid"] == unseen and job_tags(process.tags) == tags_of(BOB)


def test_a_gpu_takes_its_new_job_at_the_next_process_sample_after_prolog_and_epilog(tmp_path, monkeypatch):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE, BOB)
    assert slurm.epilog(ALICE, job_dir).returncode == 0

    points = record_agent(tmp_path, monkeypatch, [h100(0), h100(1)], None, ["--slurm-job-dir", str(job_dir)])

    held = {g: job_tags(t) for g, t in newest_tags(points, "gpu").items()}
    assert held == {"0": {}, "1": tags_of(BOB)}  # ALICE gone; GPU 1 BOB's alone now


@pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable()))
def test_the_kernels_job_wins_and_the_job_file_only_adds_account_and_partition(tmp_path, monkeypatch):
    """A process the agent can see keeps the job its cgroup names; ALICE's file completes what the cgroup lacks."""
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE, BOB)
    tree = cgroups.CgroupTree()
    try:
        v2 = cgroups.v2_root()
        assert v2 is not None
        scope = "system.slice/slurmstepd.scope"
        in_alice = tree.start(v2, f"{scope}/job_11/step_0/user/task_0")  # no SLURM_* in its environment
        other = tree.start(v2, f"{scope}/job_4242/step_0/user/task_0")  # on BOB's GPU per the mapping
        gpus = [h100(0, compute_procs=[(in_alice.pid, 1 << 30)]), h100(1), h100(2, compute_procs=[(other.pid, 1)])]
        points = record_agent(tmp_path, monkeypatch, gpus, None, ["--slurm-job-dir", str(job_dir)])
    finally:
        tree.close()
    processes = {g: job_tags(t) for g, t in newest_tags(points, "gpu_process").items()}
    assert processes == {
        "0": {"job": "11", "job_user": "root", "account": "vision", "partition": "gpu"},  # user: the kernel's
        "2": {"job": "4242", "job_user": "root"},  # not BOB's: the kernel said otherwise
    }
    assert job_tags(newest_tags(points, "gpu")["2"]) == {"job": "4242", "job_user": "root"}


def test_without_the_setting_the_agent_reads_no_mapping(tmp_path, monkeypatch):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE)
    points = record_agent(tmp_path, monkeypatch, [h100(0)], None)
    assert job_tags(newest_tags(points, "gpu")["0"]) == {}


# -- the reader ---------------------------------------------------------------------------------


def test_a_missing_directory_is_no_mapping_said_once_and_the_first_prolog_is_seen_without_a_restart(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=slurm_files.__name__)
    job_dir = tmp_path / "slurm-jobs"
    reader = SlurmJobFiles(str(job_dir), min_interval_s=0)
    for _ in range(3):
        assert reader.mapping().holder(0) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"no Slurm job mapping in {job_dir} yet (deploy/slurm/prolog.sh makes it with the first job that has a GPU)"
    ]
    run_prologs(job_dir, ALICE)
    assert reader.mapping().holder(0) == Attribution(Scheduler.SLURM, "11", user="alice", account="vision",
                                                     partition="gpu")  # fmt: skip


def test_garbage_is_said_once_per_kind_and_every_good_line_is_kept(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=slurm_files.__name__)
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE, BOB)
    (job_dir / "0").write_text("not-a-job\n\n11\n")
    (job_dir / "3").write_text("12\nalso bad\n")
    (job_dir / "notes.txt").write_text("hello")
    (job_dir / "7").mkdir()
    (job_dir / "job_12").write_text("SLURM_JOB_USER=bob\nrm -rf /\nSLURM_JOB_ACCOUNT=nlp\n")
    (job_dir / "5").write_bytes(b"1" * (70 * 1024))
    reader = SlurmJobFiles(str(job_dir), min_interval_s=0)
    for _ in range(3):
        mapping = reader.mapping()
    assert mapping.holder(0) == Attribution(Scheduler.SLURM, "11", user="alice", account="vision", partition="gpu")
    assert mapping.holder(3) == Attribution(Scheduler.SLURM, "12", user="bob", account="nlp")
    assert mapping.holder(5) is None and mapping.holder(7) is None
    messages = sorted(r.getMessage() for r in caplog.records)
    assert len(messages) == 5, messages  # one per kind: a bad job id, name, type, size and job-file line
    bad_ids = ("'0' holds 'not-a-job'", "'3' holds 'also bad'")  # the first in the directory's order
    assert any(b + ", which is not a Slurm job id; ignored" in m for m in messages for b in bad_ids)
    assert any("'notes.txt' is neither a GPU's file" in m for m in messages)
    assert any("'7' is not a regular file" in m for m in messages)
    assert any("'5' is larger than 65536 bytes" in m for m in messages)
    assert any("'job_12' holds 'rm -rf /', not one of SLURM_JOB_USER" in m for m in messages)
    assert reader.problem is not None


def test_a_mig_instances_file_names_its_job_and_the_gpus_file_covers_the_rest(tmp_path):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE)
    (job_dir / "0.2").write_text("12\n")  # dcgm-exporter's <gpu>.<GPU instance> name
    mapping = SlurmJobFiles(str(job_dir)).mapping()
    assert mapping.holder(0, 2) is not None and mapping.holder(0, 2).job == "12"  # type: ignore[union-attr]
    assert mapping.holder(0, 1) is not None and mapping.holder(0, 1).job == "11"  # type: ignore[union-attr]


def test_a_mapping_others_could_have_written_is_ignored_with_the_fix(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=slurm_files.__name__)
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE, BOB)
    os.chown(job_dir / "2", 65534, 65534)
    mapping = SlurmJobFiles(str(job_dir), min_interval_s=0).mapping()
    assert mapping.holder(0) is not None and mapping.holder(2) is None
    job_dir.chmod(0o777)
    assert SlurmJobFiles(str(job_dir), min_interval_s=0).mapping().holder(0) is None
    messages = [r.getMessage() for r in caplog.records]
    assert f"the Slurm job mapping file {job_dir / '2'} is ignored: it must belong to root" in messages[0]
    assert "(uid 65534, mode 0644); chown root and chmod go-w it" in messages[0]
    assert f"the Slurm job mapping directory {job_dir} is ignored" in messages[1] and "mode 0777" in messages[1]


def test_a_rescan_reads_only_what_changed(tmp_path):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE, BOB)
    aged(job_dir)
    reader = SlurmJobFiles(str(job_dir), min_interval_s=0)
    reader.mapping()
    assert reader.reads == 6  # four GPU files, two job files
    reader.mapping()
    assert reader.reads == 6  # nothing changed: a listing and an lstat per file, no read
    assert slurm.epilog(ALICE, job_dir).returncode == 0  # rewrites GPU 1's file, removes GPU 0's and job_11
    mapping = reader.mapping()
    assert reader.reads == 7 and mapping.holder(1) is not None and mapping.holder(0) is None


def test_calls_within_the_interval_share_one_scan(tmp_path):
    job_dir = tmp_path / "slurm-jobs"
    run_prologs(job_dir, ALICE)
    now = [0.0]
    reader = SlurmJobFiles(str(job_dir), min_interval_s=0.5, clock=lambda: now[0])
    assert reader.mapping().holder(0) is not None
    assert slurm.epilog(ALICE, job_dir).returncode == 0
    assert reader.mapping().holder(0) is not None  # the same cycle: the scan of its first GPU
    now[0] = 0.5
    assert reader.mapping().holder(0) is None


def test_a_file_given_as_the_directory_is_said_with_what_to_set(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=slurm_files.__name__)
    (tmp_path / "0").write_text("11\n")
    reader = SlurmJobFiles(str(tmp_path / "0"), min_interval_s=0)
    assert reader.mapping().holder(0) is None and reader.mapping().gpus == {}
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / '0'} is not a directory; point --slurm-job-dir (slurm_job_dir) at the directory "
        "deploy/slurm/prolog.sh writes"
    ]
