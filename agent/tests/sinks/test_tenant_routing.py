"""A job's points go to its tenant's database, the node's samples to the fleet's (``[tenants]`` in the config).

End to end on a real influxd 1.6.7 with authentication: ``gpulse setup --tenant`` makes the tenant's
database and write-only user, the agent's configuration is loaded from a TOML file with a
``[tenants]`` mapping, and the agent's delivery (one sink per destination, each with its own spool)
writes lines as the agent's sources tag them (``account`` from the Slurm job, ``job`` on training points).
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import pytest
from support.fake_influx_v2 import FakeInfluxV2
from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1

from gpulse.agent.config import load_config
from gpulse.delivery.pipeline import Delivery
from gpulse.influx.connection import ConfigError
from gpulse.sinks.base import WriteError
from gpulse.sinks.factory import build_sinks
from gpulse.sinks.influx_v2 import InfluxV2Sink
from gpulse.sinks.routing import RoutedSink, Router, TenantRoute

T = (time.time_ns() // 10**9 - 60) * 10**9
ROUTES = (TenantRoute("vision", slurm_account="vision"), TenantRoute("speech", k8s_namespace="speech"))


def test_a_job_level_point_goes_to_the_tenant_of_its_account_or_namespace_and_training_points_follow_their_job():
    r = Router(ROUTES)
    assert r.tenant_of(f"gpu,host=n1,gpu=0,account=vision,job=42 util=1 {T}\n") is None  # node-level: the fleet's
    assert r.tenant_of(f"train_step,host=n1,run=r,rank=0,job=42 loss=1 {T}\n") is None  # job 42 not seen yet
    assert r.tenant_of(f"gpu_process,host=n1,gpu=0,pid=7,account=vision,job=42 mem=1i {T}\n") == "vision"
    assert r.tenant_of(f"train_step,host=n1,run=r,rank=0,job=42 loss=1 {T}\n") == "vision"
    assert r.tenant_of(f"host_process,host=n1,pod=p,namespace=speech,job=uid-1 cpu=1 {T}\n") == "speech"
    assert r.tenant_of(f"gpu_process,host=n1,gpu=0,pid=8,account=physics,job=43 mem=1i {T}\n") is None


def test_a_refused_line_is_named_by_its_place_in_the_batch_not_in_the_tenants_part_of_it():
    fake = FakeInfluxV2(token="t", bucket="gpulse-vision").start()
    sink = RoutedSink(InfluxV2Sink(fake.url, "t", "gpulse", "gpulse-vision"), ROUTES, "vision")
    lines = [
        f"gpu,host=n1,gpu=0 util=1 {T}\n",
        f"gpu_process,host=n1,gpu=0,pid=7,account=vision,job=42 mem=1i {T}\n",
        f"gpu,host=n1,gpu=1 util=1 {T}\n",
        f"gpu_process,host=n1,gpu=1,pid=8,account=vision,job=42 mem=oops {T}\n",
    ]
    try:
        with pytest.raises(WriteError) as e:
            sink.write(lines)
    finally:
        sink.close()
        fake.stop()
    assert e.value.bad_lines == (3,)  # the server named the 2nd line it was sent


def write_config(tmp_path: Path, s: InfluxDB1, token: Path, routes: str) -> Path:
    cfg = tmp_path / "gpulse.toml"
    cfg.write_text(
        f'[connection]\nurl = "{s.url}"\napi = "v1"\nbucket = "gpulse"\ntoken_file = "{token}"\n\n'
        f'[tenants]\nsecrets_dir = "{tmp_path / "secrets"}"\n\n{routes}'
    )
    return cfg


def test_the_agents_delivery_sends_a_tenants_job_to_its_database_and_node_samples_to_the_fleets(
    influxdb_auth, tmp_path, clean_env
):
    server = influxdb_auth
    setup = ("setup", "--api", "v1", "--url", server.url, "--token-file", str(tmp_path / "admin-token"))
    for extra in ((), ("--tenant", "vision", "--secrets-dir", str(tmp_path / "secrets"))):
        run = subprocess.run(gpulse_cmd(*setup, *extra), env=clean_env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
    # the fleet's agent writes with the admin user here; the tenant's sink with gpulse_vision_writer only
    cfg = write_config(
        tmp_path, server, tmp_path / "admin-token", '[[tenants.route]]\ntenant = "vision"\nslurm_account = "vision"\n'
    )
    conf = load_config(argparse.Namespace(config=str(cfg)), env={})
    assert [name for name, _ in conf.tenant_connections] == ["vision"]
    assert conf.tenant_connections[0][1].token.startswith("gpulse_vision_writer:")

    sinks = build_sinks(conf.connection, None, conf.tenant_routes, conf.tenant_connections)
    assert [s.name for s in sinks] == ["influx", "influx-tenant-vision"]
    d = Delivery(sinks, spool_dir=tmp_path / "spool", flush_interval=0.05)
    d.start()
    d.submit([
        f"gpu,host=n1,gpu=0,uuid=GPU-0,model=H100,account=vision,job=42 util=90 {T}\n",
        f"gpu_process,host=n1,gpu=0,pid=7,account=vision,job=42 mem=1i {T}\n",
        f"train_step,host=n1,run=r1,rank=0,job=42 loss=0.5 {T}\n",
        f"gpu_process,host=n1,gpu=1,pid=8,account=physics,job=43 mem=2i {T}\n",
        f"agent,host=n1 lines_written=1i {T}\n",
    ])  # fmt: skip
    assert d.flush(10.0)
    d.close(5.0)
    admin = ("admin", "admin-pw")

    def measurements(db: str) -> dict[str, int]:
        out = {}
        for m in ("gpu", "gpu_process", "train_step", "agent"):
            rows = server.rows(f'SELECT count(*) FROM "raw"."{m}"', db=db, user=admin)
            if rows:
                out[m] = max(v for k, v in rows[0].items() if k.startswith("count_"))
        return out

    assert measurements("gpulse") == {"gpu": 1, "gpu_process": 1, "agent": 1}  # physics has no tenant: the fleet's
    assert measurements("gpulse_vision") == {"gpu_process": 1, "train_step": 1}
    assert (d.stats()["lines_dropped"], d.stats()["lines_written"]) == (0, 5)  # each line counted once


def test_a_tenant_without_its_credential_file_stops_the_agent_with_the_command_that_makes_it(tmp_path):
    s = InfluxDB1(tmp_path / "unused")  # never started: the config is checked before anything is sent
    (tmp_path / "t").write_text("u:p\n")
    (tmp_path / "t").chmod(0o600)
    cfg = write_config(tmp_path, s, tmp_path / "t", '[[tenants.route]]\ntenant = "vision"\nslurm_account = "vision"\n')
    with pytest.raises(ConfigError, match=r"run `gpulse setup --tenant vision --secrets-dir .*secrets` and copy"):
        load_config(argparse.Namespace(config=str(cfg)), env={})
    cfg = write_config(tmp_path, s, tmp_path / "t", '[[tenants.route]]\ntenant = "vision"\n')
    with pytest.raises(ConfigError, match="needs exactly one of slurm_account, k8s_namespace"):
        load_config(argparse.Namespace(config=str(cfg)), env={})


def test_a_batch_is_split_between_the_fleet_and_a_tenant_the_same_way_however_often_it_is_written():
    """A pod's training point names only its job; its process point, later in the same batch, names the namespace."""
    batch = [
        f"train_step,host=n1,run=r,rank=0,job=uid-1 loss=1 {T}\n",
        f"gpu_process,host=n1,gpu=0,pid=7,job=uid-1,pod=p,namespace=speech mem=1i {T}\n",
        f"gpu,host=n1,gpu=0 util=1 {T}\n",
    ]
    fleet, speech = Router(ROUTES), Router(ROUTES)
    first = (fleet.tenants_of(batch), speech.tenants_of(batch))
    assert first == (["speech", "speech", None], ["speech", "speech", None])
    assert (fleet.tenants_of(batch), speech.tenants_of(batch)) == first  # a retry decides as the first write
