"""The agent's settings: TOML file < GPULSE_* environment < flags, validated with clear errors."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path

import pytest
from support.fixtures import REPO, gpulse_cmd

from gpulse.agent.config import (
    MIN_INTERVAL_S,
    default_spool_dir,
    env_name,
    load_config,
    load_toml,
    parse_size,
    setting_names,
)
from gpulse.cli.commands import agent as agent_cmd
from gpulse.influx.connection import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    return parser.parse_args(list(argv))


def write_toml(tmp_path: Path, text: str) -> str:
    p = tmp_path / "gpulse.toml"
    p.write_text(text)
    return str(p)


def test_flags_beat_environment_which_beats_the_toml_file(tmp_path: Path) -> None:
    cfg_file = write_toml(
        tmp_path,
        '[agent]\ninterval = 2.0\nflush_interval = 3.0\nseed = 7\n[connection]\nurl = "http://toml:1"\nbucket = "from_toml"\norg = "o_toml"\n',
    )
    env = {
        "GPULSE_INTERVAL": "0.5",
        "GPULSE_FLUSH_INTERVAL": "4",
        "GPULSE_URL": "http://env:2",
        "GPULSE_BUCKET": "from_env",
    }
    cfg = load_config(parse("--config", cfg_file, "--interval", "0.25", "--url", "http://flag:3"), env)
    assert cfg.interval == 0.25  # flag over env over file
    assert cfg.flush_interval == 4.0  # env over file
    assert cfg.seed == 7  # file only
    assert cfg.connection.url == "http://flag:3"
    assert cfg.connection.bucket == "from_env"
    assert cfg.connection.org == "o_toml"


def test_the_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    cfg_file = write_toml(tmp_path, "[agent]\nsimulate = 3\nsimulate_model = 'A100'\n")
    cfg = load_config(parse(), {"GPULSE_CONFIG": cfg_file})
    assert (cfg.simulate, cfg.simulate_model, cfg.config_path) == (3, "A100", cfg_file)


def test_an_interval_below_a_tenth_of_a_second_is_refused_with_the_minimum_named() -> None:
    with pytest.raises(ConfigError, match=r"below the minimum of 0\.1s"):
        load_config(parse("--interval", "0.05"), {})
    assert load_config(parse("--interval", str(MIN_INTERVAL_S)), {}).interval == MIN_INTERVAL_S


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--flush-interval", "0"], {}, "--flush-interval must be a positive number"),
        ([], {"GPULSE_INTERVAL": "fast"}, "GPULSE_INTERVAL must be a number"),
        (["--simulate", "0"], {}, "--simulate must be a number of GPUs"),
        (["--simulate-model", "V100"], {}, "--simulate-model must be one of H100, A100, RTX4090"),
        (["--spool-max-bytes", "lots"], {}, "--spool-max-bytes must be a size"),
        (["--socket-group", "no-such-group-gpulse"], {}, "no such group"),
        (["--api", "v4"], {}, None),
    ],
)
def test_bad_values_name_the_setting_and_the_fix(argv: list[str], env: dict[str, str], message: str | None) -> None:
    if message is None:  # argparse itself refuses choices it does not know
        with pytest.raises(SystemExit):
            parse(*argv)
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(parse(*argv), env)


def test_unknown_keys_and_tables_in_the_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in \[agent\]: intervall"):
        load_config(parse("--config", write_toml(tmp_path, "[agent]\nintervall = 1\n")), {})
    with pytest.raises(ConfigError, match="unknown table"):
        load_toml(write_toml(tmp_path, "[agnet]\ninterval = 1\n"))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(write_toml(tmp_path, "[agent\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")


def test_a_token_written_in_the_file_is_refused_but_a_token_file_is_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="token in the TOML file is refused"):
        load_config(parse("--config", write_toml(tmp_path, '[connection]\ntoken = "s3cret"\n')), {})
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    token_file.chmod(0o600)
    cfg = load_config(parse("--config", write_toml(tmp_path, f'[connection]\ntoken_file = "{token_file}"\n')), {})
    assert cfg.connection.token == "s3cret-token"
    assert "s3cret" not in repr(cfg) and "s3cret" not in cfg.describe()


def test_without_a_url_and_with_a_record_file_the_agent_only_records(tmp_path: Path) -> None:
    cfg = load_config(parse("--record", str(tmp_path / "r.lp")), {})
    assert cfg.connection.url is None
    assert "no database" in cfg.describe()
    assert load_config(parse(), {}).connection.url == "http://127.0.0.1:8086"


def test_the_default_spool_lives_in_the_xdg_state_directory() -> None:
    assert default_spool_dir({"XDG_STATE_HOME": "/x/state"}) == "/x/state/gpulse/spool"
    assert default_spool_dir({}) == os.path.join(os.path.expanduser("~"), ".local", "state", "gpulse", "spool")
    assert load_config(parse(), {"XDG_STATE_HOME": "/x/state"}).spool_dir == "/x/state/gpulse/spool"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1GiB", 1 << 30), ("64MiB", 64 << 20), ("500MB", 500_000_000), ("2k", 2000), ("4096", 4096), (123, 123)],
)
def test_sizes_accept_binary_and_decimal_units(text: str | int, expected: int) -> None:
    assert parse_size(text, "size") == expected


def test_the_example_file_is_valid_and_documents_every_setting() -> None:
    example = REPO / "gpulse.toml.example"
    cfg = load_config(parse("--config", str(example)), {})
    assert cfg.interval == 1.0 and cfg.spool_max_bytes == 1 << 30 and cfg.max_bytes == 4 << 20
    text = example.read_text()
    for name in setting_names():
        assert re.search(rf"^#? ?{name} = ", text, re.M), f"{name} is not in gpulse.toml.example"
        assert env_name(name) == f"GPULSE_{name.upper()}"


def test_the_cli_rejects_a_too_short_interval_with_exit_code_2(clean_env: dict[str, str]) -> None:
    r = subprocess.run(
        gpulse_cmd("agent", "--simulate", "1", "--interval", "0.01", "--no-socket"),
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "interval 0.01s is below the minimum of 0.1s" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_tenants_table_is_read_and_checked_with_the_rest_of_the_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    (secrets / "tenants" / "vision").mkdir(parents=True)
    (secrets / "tenants" / "vision" / "influx-write-token").write_text("vision-write-token\n")
    (secrets / "tenants" / "vision" / "influx-write-token").chmod(0o600)
    text = (
        '[connection]\nurl = "http://127.0.0.1:9"\norg = "o"\n\n'
        f'[tenants]\nsecrets_dir = "{secrets}"\n\n[[tenants.route]]\ntenant = "vision"\nk8s_namespace = "cv"\n'
    )
    cfg = load_config(parse("--config", write_toml(tmp_path, text)), {"GPULSE_TOKEN": "fleet-token"})
    assert [(r.tenant, r.k8s_namespace) for r in cfg.tenant_routes] == [("vision", "cv")]
    [(name, conn)] = cfg.tenant_connections
    assert (name, conn.url, conn.org, conn.bucket, conn.token) == (
        "vision", "http://127.0.0.1:9", "o", "gpulse-vision", "vision-write-token",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in \[tenants\]: routes"):
        load_config(parse("--config", write_toml(tmp_path, "[tenants]\nroutes = []\n")), {})


def test_the_documented_tenants_example_is_a_valid_tenants_table(tmp_path: Path) -> None:
    from gpulse.agent.tenants_config import EXAMPLE

    secrets = tmp_path / "etc-gpulse-secrets"
    for name in ("vision", "speech"):
        (secrets / "tenants" / name).mkdir(parents=True)
        (secrets / "tenants" / name / "influx-write-token").write_text(f"{name}-token\n")
        (secrets / "tenants" / name / "influx-write-token").chmod(0o600)
    text = '[connection]\nurl = "http://127.0.0.1:9"\n\n' + EXAMPLE.replace("/etc/gpulse/secrets", str(secrets))
    cfg = load_config(parse("--config", write_toml(tmp_path, text)), {"GPULSE_TOKEN": "fleet-token"})
    assert [(n, c.bucket, c.token) for n, c in cfg.tenant_connections] == [
        ("vision", "gpulse-vision", "vision-token"),
        ("speech", "gpulse-speech", "speech-token"),
    ]
