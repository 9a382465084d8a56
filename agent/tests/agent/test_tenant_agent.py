"""Tenants through a whole node: one real ``gpulse agent`` routes each Slurm job's points to its team's database.

A site does what the docs say: ``gpulse setup --api v1`` for the fleet and ``--tenant a``, ``--tenant b``
on a real influxd 1.6.7 with authentication, then one agent per node with a ``[tenants]`` table in its
TOML file and each team's write credential in ``secrets_dir``. Three real training processes
(``gpulse.training`` on the CPU) run as slurmstepd starts tasks: each in a real cgroup of Slurm's
cgroup v2 layout (``…/slurmstepd.scope/job_<id>/step_0/user/task_0``) with its job's environment.
Jobs of accounts ``a-team`` and ``b-team`` are routed; ``c-team`` has no route, so its points stay
in the fleet's database (docs/configuration.md). Each team's read-only user then reads its own
database: every point its job sent, none of another's; the fleet's database holds the node's GPU
samples and the unrouted job's points, and no point lands twice or nowhere.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from agentproc import AgentProc
from support import cgroups
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1
from support.waiting import eventually, wait_until

from gpulse.influx.setup.tenant import READ_FILE

pytestmark = [
    pytest.mark.influxdb,
    pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable())),
]

ADMIN = "admin:admin-pw"
STEPS = 12
#: job id -> its Slurm account (the tenant of a-team and b-team; c-team has no route)
JOBS = {"5101": "a-team", "5102": "b-team", "5103": "c-team"}
TRAINING_MEASUREMENTS = ("train_run", "train_step", "train_event")

#: A tiny CPU loop: waits until the test has moved it into its job's cgroup (as slurmstepd does before exec).
TRAIN = textwrap.dedent(
    """
    import sys, time, torch
    from gpulse.training import Run
    sys.stdin.readline()
    model, data = torch.nn.Linear(8, 1), torch.randn(16, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = Run(name=sys.argv[1], output_dir=sys.argv[2], socket_path=sys.argv[3])
    for i in range({steps}):
        with run.step(samples=16):
            loss = model(data).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.05)
    run.mark("eval", "half way")
    run.finish()
    print(run.run_id)
    """
).format(steps=STEPS)


def setup(server: InfluxDB1, tmp_path: Path, env: dict[str, str], *extra: str) -> None:
    args = ("setup", "--api", "v1", "--url", server.url, "--token-file", str(tmp_path / "admin-token"), *extra)
    run = subprocess.run(gpulse_cmd(*args), env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def config(tmp_path: Path, server: InfluxDB1) -> Path:
    path = tmp_path / "gpulse.toml"
    path.write_text(
        f'[connection]\nurl = "{server.url}"\napi = "v1"\nbucket = "gpulse"\ntoken_file = "{tmp_path / "admin-token"}"\n\n'
        f'[tenants]\nsecrets_dir = "{tmp_path / "secrets"}"\n\n'
        '[[tenants.route]]\ntenant = "a"\nslurm_account = "a-team"\n\n'
        '[[tenants.route]]\ntenant = "b"\nslurm_account = "b-team"\n'
    )
    return path


def counts(server: InfluxDB1, credentials: str, db: str) -> dict[tuple[str, str], int]:
    """(measurement, run) -> points, read with ``credentials`` (``user:password``, as a tenant's file holds)."""
    auth = "Basic " + base64.b64encode(credentials.encode()).decode()
    out: dict[tuple[str, str], int] = {}
    for m in (*TRAINING_MEASUREMENTS, "host_process", "gpu", "gpu_process"):
        q = urllib.parse.urlencode({"db": db, "q": f'SELECT count(*) FROM "raw"."{m}" GROUP BY "run"'})
        req = urllib.request.Request(f"{server.url}/query?{q}", headers={"Authorization": auth})
        with urllib.request.urlopen(req, timeout=30) as r:
            result = json.loads(r.read())["results"][0]
        assert "error" not in result, result
        for s in result.get("series") or []:
            values = dict(zip(s["columns"], s["values"][0], strict=True))
            out[m, s.get("tags", {}).get("run", "")] = max(v for k, v in values.items() if k.startswith("count_"))
    return out


def run_jobs(tree: cgroups.CgroupTree, sock: Path, tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """Each job's training process, moved into its job's cgroup before it starts its run; job -> run id."""
    v2 = cgroups.v2_root()
    assert v2 is not None
    trainers = {}
    for job, account in JOBS.items():
        job_env = {**env, "SLURM_JOB_ID": job, "SLURM_JOB_ACCOUNT": account, "SLURM_JOB_PARTITION": "gpu"}
        p = subprocess.Popen(
            [sys.executable, "-c", TRAIN, f"job-{job}", str(tmp_path / f"job-{job}"), str(sock)],
            env=job_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        tree.procs.append(p)  # type: ignore[arg-type]
        leaf = tree.make(v2, f"system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0")
        (leaf / "cgroup.procs").write_text(f"{p.pid}\n")
        trainers[job] = p
    for p in trainers.values():
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    runs = {}
    for job, p in trainers.items():
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        runs[job] = stdout.strip().splitlines()[-1]
        assert not (tmp_path / f"job-{job}" / "gpulse-records.rec").exists(), "the agent took every point"
    return runs


def test_one_agent_sends_each_jobs_training_points_to_its_teams_database_and_nowhere_else(
    influxdb_auth, tmp_path, clean_env
):
    server = influxdb_auth
    setup(server, tmp_path, clean_env)
    for team in ("a", "b"):
        setup(server, tmp_path, clean_env, "--tenant", team, "--secrets-dir", str(tmp_path / "secrets"))
    sock = tmp_path / "sock" / "agent.sock"
    agent = AgentProc(
        ["--config", str(config(tmp_path, server)), "--simulate", "2", "--interval", "0.2", "--flush-interval", "0.2",
         "--socket", str(sock), "--spool-dir", str(tmp_path / "spool"), "--self-metrics-interval", "60"],
        clean_env, tmp_path,
    )  # fmt: skip
    try:
        wait_until(lambda: sock.exists() or not agent.alive(), 30, "the agent's socket")
        assert agent.alive(), agent.stderr
        with cgroups.CgroupTree() as tree:
            runs = run_jobs(tree, sock, tmp_path, clean_env)
        # what each run sent: its start and end, every step, one mark
        sent = {job: {"train_run": 2, "train_step": STEPS, "train_event": 1} for job in JOBS}
        secrets = tmp_path / "secrets" / "tenants"
        readers = {team: (secrets / team / READ_FILE).read_text().strip() for team in ("a", "b")}
        where = {"5101": ("a", "gpulse_a"), "5102": ("b", "gpulse_b"), "5103": (None, "gpulse")}

        def landed() -> dict[str, dict[str, dict[str, int]]]:
            dbs = {
                "gpulse": counts(server, ADMIN, "gpulse"),
                **{f"gpulse_{t}": counts(server, readers[t], f"gpulse_{t}") for t in ("a", "b")},
            }
            return {
                db: {job: {m: c.get((m, runs[job]), 0) for m in TRAINING_MEASUREMENTS} for job in JOBS}
                for db, c in dbs.items()
            }

        expected = {
            db: {job: (sent[job] if where[job][1] == db else dict.fromkeys(TRAINING_MEASUREMENTS, 0)) for job in JOBS}
            for db in ("gpulse", "gpulse_a", "gpulse_b")
        }
        eventually(lambda: landed() == expected, 30, every=0.2)
        assert landed() == expected

        fleet = counts(server, ADMIN, "gpulse")
        assert fleet.get(("gpu", ""), 0) > 0  # the node's GPU samples are the operators'
        # the agent's samples of each training process (CPU, memory) go where the job's points go
        sampled = {db: counts(server, ADMIN, db) for db in ("gpulse", "gpulse_a", "gpulse_b")}
        assert {
            job: [db for db, c in sampled.items() if c.get(("host_process", runs[job]), 0) > 0] for job in JOBS
        } == {job: [where[job][1]] for job in JOBS}
        for team in ("a", "b"):
            own = counts(server, readers[team], f"gpulse_{team}")
            assert not any(m == "gpu" for m, _ in own)  # no node-level sample in a team's database
            with pytest.raises(urllib.error.HTTPError) as refused:  # nor can it read the other's
                counts(server, readers[team], f"gpulse_{'b' if team == 'a' else 'a'}")
            assert refused.value.code == 403
    finally:
        rc = agent.stop()
    assert rc == 0, agent.stderr
    summary = agent.summary()
    assert summary["lines_dropped"] == 0, summary
