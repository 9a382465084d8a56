"""docker-compose.yml: valid against the Compose Specification, and the project's rules for the stack.

No Docker engine here: the file is checked against the compose-spec JSON schema vendored in
check-jsonschema (offline), and the rules are read from the YAML: exact image tags, loopback ports,
healthchecks, secrets only through files, both InfluxDB volumes, start order, the agent profile.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.fixtures import REPO
from support.snapshots import show, snapshot

COMPOSE = REPO / "docker-compose.yml"
SECRETS = {"influxdb-admin-password", "influxdb-admin-token", "grafana-admin-password", "grafana-influx-token"}
SECRETS |= {"influxdb3-admin-token", "influxdb3-admin-token.json"}  # profile v3


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR:-default}`` with the defaults (what runs when .env sets nothing)."""
    env = env or {}
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or "check-jsonschema"
    return subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(path)], capture_output=True, text=True, timeout=60
    )


def test_the_compose_file_validates_against_the_compose_spec_schema():
    r = check_jsonschema(COMPOSE)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_schema_check_catches_a_misspelled_key_and_a_bad_condition(tmp_path):
    for bad in (
        COMPOSE.read_text().replace("    healthcheck:\n", "    healthchek:\n", 1),
        COMPOSE.read_text().replace("condition: service_healthy", "condition: service_ok", 1),
    ):
        (tmp_path / "bad.yml").write_text(bad)
        r = check_jsonschema(tmp_path / "bad.yml")
        assert r.returncode == 1, r.stdout


def test_images_are_pinned_to_exact_versions_never_latest(compose):
    services = compose["services"]
    assert re.fullmatch(r"influxdb:2\.9\.\d+", services["influxdb"]["image"])
    assert re.fullmatch(r"influxdb:3\.\d+\.\d+-core", services["influxdb3"]["image"])
    # the image whose own types the dashboards are checked against (tests/grafana-types)
    types = json.loads((REPO / "tests" / "grafana-types" / "package.json").read_text())["dependencies"]
    assert services["grafana"]["image"] == f"grafana/grafana:{types['@grafana/schema']}"
    assert re.fullmatch(r"13\.2\.\d+", types["@grafana/schema"]) and types["@grafana/data"] == types["@grafana/schema"]
    for name, svc in services.items():
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), name
        if "build" in svc:  # our own image, built from agent/
            assert image == "gpulse:local" and svc["build"]["context"] == "./agent"
    dockerfile = (REPO / "agent" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.12-slim$", dockerfile, re.M) and "torch" not in dockerfile.replace(
        "no torch", ""
    )


def test_ports_bind_to_loopback_unless_the_env_file_says_otherwise(compose):
    published = [p for svc in compose["services"].values() for p in svc.get("ports", [])]
    assert len(published) == 4  # InfluxDB and Grafana, and the same two of profile v3
    for p in published:
        assert p.startswith("${GPULSE_BIND:-127.0.0.1}:"), p
        assert interpolate(p).startswith("127.0.0.1:")
        assert interpolate(p, {"GPULSE_BIND": "0.0.0.0"}).startswith("0.0.0.0:")
    assert "GPULSE_BIND=127.0.0.1" in (REPO / ".env.example").read_text().splitlines()


def test_influxdb_and_grafana_have_healthchecks_and_start_in_order(compose):
    s = compose["services"]
    assert "curl -fsS http://localhost:8086/health" in " ".join(s["influxdb"]["healthcheck"]["test"])
    assert "/api/health" in " ".join(s["grafana"]["healthcheck"]["test"])
    assert s["setup"]["depends_on"] == {"influxdb": {"condition": "service_healthy"}}
    assert s["grafana"]["depends_on"] == {
        "influxdb": {"condition": "service_healthy"},
        "setup": {"condition": "service_completed_successfully"},  # its datasource token exists by then
    }
    assert s["agent"]["depends_on"]["setup"] == {"condition": "service_completed_successfully"}


def test_influxdb_keeps_data_and_config_in_named_volumes(compose):
    mounts = dict(v.split(":")[::-1] for v in compose["services"]["influxdb"]["volumes"])
    assert set(mounts) == {"/var/lib/influxdb2", "/etc/influxdb2"}
    assert set(mounts.values()) <= set(compose["volumes"])
    assert "/var/lib/grafana" in [
        v.split(":")[1] for v in compose["services"]["grafana"]["volumes"] if isinstance(v, str)
    ]


def test_secrets_reach_containers_only_as_files(compose):
    declared = compose["secrets"]
    assert set(declared) == SECRETS
    assert all(declared[n] == {"file": f"./secrets/{n}"} for n in SECRETS)
    file_vars = {}
    for name, svc in compose["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            if re.search(r"PASSWORD|TOKEN|SECRET", key):
                assert key.endswith("_FILE"), f"{name}: {key} must be a *_FILE variable"
                secret = value.removeprefix("/run/secrets/")
                assert secret in svc["secrets"], f"{name}: {key} reads a secret the service does not mount"
                file_vars[key] = secret
    assert file_vars == {
        "DOCKER_INFLUXDB_INIT_PASSWORD_FILE": "influxdb-admin-password",
        "DOCKER_INFLUXDB_INIT_ADMIN_TOKEN_FILE": "influxdb-admin-token",
        "GF_SECURITY_ADMIN_PASSWORD__FILE": "grafana-admin-password",
    }


def test_grafanas_environment_never_carries_the_influxdb_token(compose):
    """Grafana's ``run.sh`` exports every ``GF_<X>__FILE`` file's content as ``GF_<X>``; the datasource
    reads the token with ``$__file{...}``, so no variable may bring it into Grafana's environment."""
    grafana = compose["services"]["grafana"]
    assert not [v for v in (grafana.get("environment") or {}).values() if "grafana-influx-token" in str(v)]
    datasource = (REPO / "grafana" / "provisioning" / "datasources" / "influxdb.yaml").read_text()
    assert "$__file{/run/secrets/grafana-influx-token}" in datasource and "$GF_" not in datasource


def test_no_literal_password_or_token_anywhere_in_the_stack_files(compose):
    for path in (COMPOSE, REPO / ".env.example"):
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            m = re.search(r"(PASSWORD|TOKEN|SECRET)\w*\s*[:=]\s*(\S+)", line)
            assert not m or "/run/secrets/" in m.group(2), f"{path.name}: {line}"
    text = COMPOSE.read_text()
    assert not re.search(r"DOCKER_INFLUXDB_INIT_(PASSWORD|ADMIN_TOKEN):", text)


def test_the_secret_files_are_documented_for_make_up():
    for doc in (REPO / ".env.example", REPO / "influxdb" / "README.md"):
        text = doc.read_text()
        for name in SECRETS:
            assert f"secrets/{name}" in text, f"{doc.name} must name secrets/{name}"
    assert "secrets/" in (REPO / ".gitignore").read_text().splitlines()


def _parse(module: str, command: list[str]) -> argparse.Namespace:
    import importlib

    parser = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module(f"gpulse.cli.commands.{module}").add_arguments(parser)
    return parser.parse_args([interpolate(a) for a in command])


def test_the_setup_service_runs_gpulse_setup_with_the_admin_token_and_writes_grafanas(compose):
    svc = compose["services"]["setup"]
    assert svc["command"][0] == "setup" and svc["restart"] == "no"
    args = _parse("setup", svc["command"][1:])
    assert (args.url, args.api, args.org, args.bucket) == ("http://influxdb:8086", "v2", "gpulse", "gpulse")
    assert args.token_file == "/run/secrets/influxdb-admin-token" and "influxdb-admin-token" in svc["secrets"]
    (mount,) = [v for v in svc["volumes"] if isinstance(v, dict)]
    assert mount["source"] == "./secrets/grafana-influx-token" and mount["bind"]["create_host_path"] is False
    assert args.grafana_token_file == mount["target"]
    grafana = compose["services"]["grafana"]
    datasource = (REPO / "grafana" / "provisioning" / "datasources" / "influxdb.yaml").read_text()
    m = re.search(r"\$__file\{/run/secrets/([\w-]+)\}", datasource)
    assert m and m.group(1) == "grafana-influx-token" and m.group(1) in grafana["secrets"]


def test_grafana_mounts_the_provisioning_and_dashboards_of_this_repository(compose):
    grafana = compose["services"]["grafana"]
    binds = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"] if v.startswith("./")}
    assert (REPO / binds["/etc/grafana/provisioning"]).is_dir()
    provider = yaml.safe_load((REPO / "grafana" / "provisioning" / "dashboards" / "gpulse.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert (REPO / binds[path]).is_dir()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (REPO / binds[path] / Path(home).relative_to(path)).is_file()
    assert grafana["user"] == compose["services"]["setup"]["user"]  # both read the 0600 files of secrets/


def test_the_agent_service_is_optional_with_gpus_host_pids_and_the_socket_directory(compose):
    agent = compose["services"]["agent"]
    assert agent["profiles"] == ["agent"] and agent["pid"] == "host"
    (device,) = agent["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": "all", "capabilities": ["gpu", "utility"]}
    volumes = agent["volumes"]
    (socket_dir,) = [v for v in volumes if isinstance(v, dict)]
    assert socket_dir["target"] == "/run/gpulse" and interpolate(socket_dir["source"]) == "/run/user/1000/gpulse"
    assert "/var/run/docker.sock:/var/run/docker.sock:ro" in volumes
    args = _parse("agent", agent["command"][1:])
    assert args.socket == "/run/gpulse/agent.sock" and args.token_file == "/run/secrets/influxdb-admin-token"
    assert args.spool_dir.startswith("/var/lib/gpulse") and any(
        v.endswith(":/var/lib/gpulse") for v in volumes if isinstance(v, str)
    )


def test_make_e2e_skips_with_a_clear_message_where_no_docker_engine_runs(tmp_path):
    import os

    env = os.environ | {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    r = subprocess.run(["bash", str(REPO / "scripts" / "e2e.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "make e2e: skipped: no Docker engine" in r.stdout


def test_make_up_stays_influxdb_2_and_profile_v3_adds_influxdb_3_core_with_its_setup_and_grafana(compose):
    services = compose["services"]
    default = {name for name, svc in services.items() if not svc.get("profiles")}
    assert default == {"influxdb", "setup", "grafana", "alert-log"}  # what `docker compose up` runs
    v3 = {name for name, svc in services.items() if svc.get("profiles") == ["v3"]}
    assert v3 == {"influxdb3", "setup-v3", "grafana-v3"}
    # `up grafana-v3` starts only what it depends on: InfluxDB 3 and its setup, none of the 2.9 stack
    assert set(services["grafana-v3"]["depends_on"]) == {"influxdb3", "setup-v3"}
    assert services["setup-v3"]["depends_on"] == {"influxdb3": {"condition": "service_healthy"}}


def test_influxdb3_serves_the_generated_plugin_directory_with_the_admin_token_from_a_secret_file(compose):
    from gpulse.influx import engine_plugin

    svc = compose["services"]["influxdb3"]
    args = dict(a.removeprefix("--").split("=", 1) for a in svc["command"][1:])
    assert svc["command"][0] == "serve" and args["plugin-dir"] == "/plugins"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
    assert mounts["/plugins"] == "./influxdb/v3/plugins" and svc["volumes"][1].endswith(":ro")
    assert (REPO / "influxdb" / engine_plugin.PLUGIN_PATH).is_file()
    assert args["virtual-env-location"].startswith("/var/lib/influxdb3/")  # writable: /plugins is not
    assert mounts["/var/lib/influxdb3"] in compose["volumes"]
    assert args["admin-token-file"] == "/run/secrets/influxdb3-admin-token.json"
    assert "influxdb3-admin-token.json" in svc["secrets"]
    assert args["disable-authz"] == "health,ping" and "8181/health" in " ".join(svc["healthcheck"]["test"])
    assert not [a for a in svc["command"] if "apiv3_" in a or a.startswith("--admin-token=")]
    user, group = svc["user"].split(":", 1)
    assert user == "1500" and group == "${GPULSE_GID:-1000}"  # the image's user, in the group of secrets/


def test_grafana_v3_reads_the_tier_databases_with_the_v3_token_on_its_own_port(compose):
    from gpulse.dashboards import datasources

    grafana, v3 = compose["services"]["grafana"], compose["services"]["grafana-v3"]
    assert v3["image"] == grafana["image"] and v3["environment"] == grafana["environment"]
    binds = {v.split(":")[1]: v.split(":")[0] for v in v3["volumes"]}
    assert binds["/etc/grafana/provisioning/datasources"] == "./" + str(Path(datasources.V3.path).parent)
    assert binds["/etc/grafana/provisioning"] == "./grafana/provisioning"
    assert binds["/var/lib/grafana"] in compose["volumes"] and binds["/var/lib/grafana"] != "grafana-data"
    assert {"source": "influxdb3-admin-token", "target": "grafana-influx-token"} in v3["secrets"]
    (port,) = v3["ports"]
    assert interpolate(port) == "127.0.0.1:3001:3000"
    args = [interpolate(a) for a in compose["services"]["setup-v3"]["command"]]
    assert args[0] == "setup" and {"--url=http://influxdb3:8181", "--api=v3", "--bucket=gpulse"} <= set(args)
    assert "--token-file=/run/secrets/influxdb3-admin-token" in args


def test_gen_secrets_writes_the_v3_admin_token_as_the_server_reads_it_and_never_replaces_it(tmp_path):
    import os
    import stat

    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "gen-secrets.sh", tmp_path / "scripts")
    run = lambda: subprocess.run(  # noqa: E731
        ["bash", str(tmp_path / "scripts" / "gen-secrets.sh")], capture_output=True, text=True, timeout=60, check=True
    )
    out = run().stdout
    token = (tmp_path / "secrets" / "influxdb3-admin-token").read_text().strip()
    doc = json.loads((tmp_path / "secrets" / "influxdb3-admin-token.json").read_text())
    assert token.startswith("apiv3_") and len(token) > 40 and doc == {"token": token, "name": "gpulse-admin"}
    assert token not in out and "secrets/influxdb3-admin-token" in out
    mode = lambda n: stat.S_IMODE(os.stat(tmp_path / "secrets" / n).st_mode)  # noqa: E731
    assert mode("influxdb3-admin-token") == 0o600 and mode("influxdb3-admin-token.json") == 0o640
    run()
    assert (tmp_path / "secrets" / "influxdb3-admin-token").read_text().strip() == token


# -- The image pins against tests/image-pins.toml (what was verified in the public record) ----------

PINS_FILE = REPO / "tests" / "image-pins.toml"


@pytest.fixture(scope="module")
def pins() -> dict:
    import tomllib

    return tomllib.loads(PINS_FILE.read_text())


def test_every_pinned_image_is_the_one_recorded_as_verified(compose, pins):
    pinned = {name: svc["image"] for name, svc in compose["services"].items() if "build" not in svc}
    recorded = {name: pin["image"] for name, pin in pins.items()}
    assert recorded == {n: pinned[n] for n in recorded}, "re-verify the tag and change tests/image-pins.toml with it"
    assert set(pinned.values()) == set(recorded.values())  # grafana-v3 shares grafana's image
    for name, pin in pins.items():
        if "tags_line" in pin:  # an official image: its tag is in the library's Tags line
            tag = pin["image"].split(":", 1)[1]
            assert tag in [t.strip() for t in pin["tags_line"].removeprefix("Tags:").split(",")], name
            assert pin["version_env"].endswith("=" + tag.removesuffix("-core")), name


def test_influxdb_2_uses_the_images_port_volumes_and_init_file_variables(compose, pins):
    pin, svc = pins["influxdb"], compose["services"]["influxdb"]
    assert [interpolate(p).rsplit(":", 1)[1] for p in svc["ports"]] == [str(pin["port"])]
    assert {v.split(":")[1] for v in svc["volumes"]} == set(pin["volumes"])
    assert set(pin["init_file_variables"]) <= set(svc["environment"])
    assert f"{pin['healthcheck_tool']} -fsS http://localhost:{pin['port']}/" in " ".join(svc["healthcheck"]["test"])


def test_influxdb_3_runs_as_the_images_user_on_its_port_with_its_plugin_dir_and_writable_volume(compose, pins):
    pin, svc = pins["influxdb3"], compose["services"]["influxdb3"]
    assert svc["user"].split(":")[0] == str(pin["uid"])
    assert [interpolate(p).rsplit(":", 1)[1] for p in svc["ports"]] == [str(pin["port"])]
    assert f"{pin['healthcheck_tool']} -fsS http://localhost:{pin['port']}/" in " ".join(svc["healthcheck"]["test"])
    assert svc["command"][0] == "serve"  # the entrypoint prefixes `influxdb3`, as in the image's CMD
    assert pin["cmd"] == ["influxdb3", "serve"] and "entrypoint" not in svc
    args = dict(a.removeprefix("--").split("=", 1) for a in svc["command"][1:])
    assert args["plugin-dir"] == pin["plugin_dir"]
    # what the server writes lies in a named volume over a directory the image gives its user
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
    (data_mount,) = [target for target, source in mounts.items() if source in compose["volumes"]]
    assert data_mount in pin["owned_by_uid"]
    for key in ("data-dir", "virtual-env-location"):
        assert args[key].startswith(data_mount + "/"), key


def _library_file(commit: str) -> str:
    text = show(snapshot("docker-library/official-images", commit), commit, "library/influxdb")
    assert text is not None, f"official-images {commit} has no library/influxdb"
    return text


@pytest.mark.parametrize("service", ["influxdb", "influxdb3"])
def test_the_record_quotes_the_official_tag_list_where_a_snapshot_of_it_is_at_hand(pins, service):
    pin = pins[service]
    blocks = _library_file(pin["library_commit"]).split("\n\n")
    block = next((b for b in blocks if b.startswith(pin["tags_line"] + "\n")), None)
    assert block is not None, f"{pin['tags_line']!r} is not a Tags line of library/influxdb at {pin['library_commit']}"
    assert f"Directory: {pin['directory']}" in block.splitlines()
