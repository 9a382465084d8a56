"""The agent's own settings: TOML file < ``GPULSE_*`` environment < flags.

The TOML file has two tables: ``[agent]`` (the keys of :class:`AgentConfig`, see
``gpulse.toml.example``) and ``[connection]`` (resolved by :func:`gpulse.agent.connection_config.resolve_connection`;
every command that talks to a database reads it through :func:`load_connection`, so all read the database
settings the same way). Unknown keys are refused: a typo in a
config file must not silently fall back to a default.

Every value is validated here, once, with a message that names the setting and says how to fix it,
so the agent loop never has to second-guess its configuration.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpulse.agent.connection_config import CONNECTION_KEYS, config_path, resolve_connection
from gpulse.influx.connection import ConfigError, Connection
from gpulse.sinks.routing import TenantRoute

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

MIN_INTERVAL_S = 0.1
SIMULATE_MODELS = ("H100", "A100", "RTX4090")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def default_spool_dir(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_STATE_HOME/gpulse/spool``, else ``~/.local/state/gpulse/spool``."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "gpulse", "spool")


def default_socket_path() -> str:
    """The training channel's default socket (one definition, in the wire-protocol module)."""
    from gpulse.channel.protocol import default_socket_path as protocol_default

    return protocol_default()


def parse_size(value: Any, name: str) -> int:
    """Bytes from an int or a string such as ``1GiB``, ``64MiB``, ``500k``."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a size in bytes, not {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise ConfigError(f"{name} must be a size such as 1073741824, 1GiB or 500MB, not {value!r}")
        unit = (m.group(2) or "").lower()
        base = 1024 if "i" in unit else 1000
        mult = _UNITS[unit[:1]] if base == 1000 else base ** "bkmgt".index(unit[:1])
        n = int(float(m.group(1)) * mult)
    if n <= 0:
        raise ConfigError(f"{name} must be positive, not {value!r}")
    return n


def _float(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number of seconds, not {value!r}") from None
    if not v > 0 or v == float("inf"):
        raise ConfigError(f"{name} must be a positive number of seconds, not {value!r}")
    return v


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, not {value!r}") from None


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def _str(value: Any, name: str) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ConfigError(f"{name} must be a string, not {value!r}")
    return str(value)


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent needs, validated. ``connection.url is None`` means recording only."""

    connection: Connection
    interval: float = 1.0
    flush_interval: float = 1.0
    spool_dir: str = ""
    spool_max_bytes: int = 1 << 30
    record: str | None = None
    simulate: int | None = None
    simulate_model: str = "H100"
    seed: int = 0
    socket: str | None = None  # None: the protocol's default path
    socket_group: str | None = None
    no_socket: bool = False
    #: do not sample the host beside the GPUs (measurements ``host`` and ``host_process``)
    no_host_metrics: bool = False
    #: the directory of a Slurm prolog's GPU-to-job mapping (``deploy/slurm/prolog.sh``); None: not read
    slurm_job_dir: str | None = None
    host: str = ""
    duration: float | None = None
    shutdown_timeout: float = 5.0
    self_metrics_interval: float = 10.0
    status_interval: float = 30.0  # plain log status every N s when stderr is not a terminal
    #: the rolling findings' window (``gpulse.report.live``): the last N steps or S seconds, whichever is longer
    live_window_steps: int = 100
    live_window_s: float = 120.0
    #: seconds between two evaluations of the rolling findings
    live_every_s: float = 5.0
    #: judge no rolling findings (no ``train_finding`` points, nothing told to the runs)
    no_live_findings: bool = False
    max_lines: int = 5000
    max_bytes: int = 4 << 20
    #: replay data spooled for another destination (another URL, API, org/bucket, database) into this one
    replay_spool_to_new_destination: bool = False
    #: ``[tenants]``: which jobs are which team's, and each team's connection (:mod:`gpulse.agent.tenants_config`)
    tenant_routes: tuple[TenantRoute, ...] = ()
    tenant_connections: tuple[tuple[str, Connection], ...] = ()
    #: at exit, the final counts as JSON go to this file (scripts and tests read them; people read the log line)
    summary_file: str | None = None
    config_path: str | None = field(default=None, compare=False)
    #: a URL set but not used, because a stronger setting asked for recording only (:func:`record_only`)
    unused_url: str | None = field(default=None, compare=False)

    @property
    def socket_path(self) -> str:
        return self.socket or default_socket_path()

    def describe(self) -> str:
        """One line for the log: no secret in it."""
        src = f"simulated {self.simulate}x{self.simulate_model} (seed {self.seed})" if self.simulate else "NVML"
        dest = self.connection.describe() if self.connection.url else "no database"
        rec = f", recording to {self.record}" if self.record else ""
        if self.unused_url:
            rec += f" (recording only: {self.unused_url} is not used; add --url to send there too)"
        if self.slurm_job_dir and not self.simulate:
            src += f" (Slurm jobs also from {self.slurm_job_dir})"
        return f"{src} every {self.interval:g}s -> {dest}{rec}; spool {self.spool_dir}"


# setting -> (converter, environment variable); flags use the same name as the dataclass field.
_Conv = Callable[[Any, str], Any]
_SETTINGS: dict[str, _Conv] = {
    "interval": _float,
    "flush_interval": _float,
    "spool_dir": _str,
    "spool_max_bytes": parse_size,
    "record": _str,
    "simulate": _int,
    "simulate_model": _str,
    "seed": _int,
    "socket": _str,
    "socket_group": _str,
    "no_socket": _bool,
    "no_host_metrics": _bool,
    "slurm_job_dir": _str,
    "host": _str,
    "duration": _float,
    "shutdown_timeout": _float,
    "self_metrics_interval": _float,
    "status_interval": _float,
    "live_window_steps": _int,
    "live_window_s": _float,
    "live_every_s": _float,
    "no_live_findings": _bool,
    "max_lines": _int,
    "max_bytes": parse_size,
    "replay_spool_to_new_destination": _bool,
    "summary_file": _str,
}


def env_name(setting: str) -> str:
    return f"GPULSE_{setting.upper()}"


def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a gpulse TOML file; a missing or malformed file is a :class:`ConfigError`."""
    p = Path(path).expanduser()
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    unknown = set(data) - {"agent", "connection", "tenants"}
    if unknown:
        raise ConfigError(
            f"config file {p}: unknown table(s) {', '.join(sorted(unknown))}; use [agent], [connection] and [tenants]"
        )
    for table, allowed in (("agent", tuple(_SETTINGS)), ("connection", (*CONNECTION_KEYS, "token"))):
        section = data.get(table, {})
        if not isinstance(section, dict):
            raise ConfigError(f"config file {p}: [{table}] must be a table")
        bad = set(section) - set(allowed)
        if bad:
            raise ConfigError(
                f"config file {p}: unknown key(s) in [{table}]: {', '.join(sorted(bad))} "
                f"(known: {', '.join(allowed if table == 'agent' else CONNECTION_KEYS)})"
            )
    return data


def load_connection(
    args: argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
    *,
    url_optional: bool = False,
    record_flag: bool = False,
) -> Connection:
    """Any command's connection: the config file's ``[connection]`` < environment < flags (and defaults).

    ``record_flag``: the command was given ``--record``, which takes a URL only from ``--url``
    (:func:`record_only`; :func:`url_unused_by_record` names the URL that leaves out)."""
    env, table, path, _unused = _connection_sources(args, env, record_flag)
    return resolve_connection(args, env, table, url_optional=url_optional, config_path=path)


def url_unused_by_record(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The URL a ``--record`` flag leaves unused (``GPULSE_URL=...``, ``url in FILE``), if any."""
    return _connection_sources(args, env, True)[3]


def _connection_sources(
    args: argparse.Namespace | None, env: Mapping[str, str] | None, record_flag: bool
) -> tuple[Mapping[str, str], Mapping[str, Any], str | None, str | None]:
    """(environment, ``[connection]`` table, config path, unused URL) a connection is resolved from."""
    env = os.environ if env is None else env
    path = config_path(args, env)
    table = load_toml(path).get("connection", {}) if path else {}
    url_flag = getattr(args, "url", None) is not None
    env, table, unused = record_only("flag" if record_flag else "", url_flag, env, table, path)
    return env, table, path, unused


def load_config(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """Merge the TOML file (``--config`` or ``GPULSE_CONFIG``) < environment < flags, and validate."""
    env = os.environ if env is None else env
    a = vars(args) if args is not None else {}
    path = config_path(args, env)
    data = load_toml(path) if path else {}
    toml_agent: dict[str, Any] = data.get("agent", {})

    values: dict[str, Any] = {}
    record_from = ""
    for name, conv in _SETTINGS.items():
        if a.get(name) is not None:
            raw, where, level = a[name], f"--{name.replace('_', '-')}", "flag"
        elif env.get(env_name(name)):
            raw, where, level = env[env_name(name)], env_name(name), "env"
        elif name in toml_agent:
            raw, where, level = toml_agent[name], f"{name} in {path}", "file"
        else:
            continue
        values[name] = conv(raw, where)
        if name == "record":
            record_from = level

    record = values.get("record")
    url_flag = a.get("url") is not None
    conn_env, conn_toml, unused_url = record_only(record_from, url_flag, env, data.get("connection") or {}, path)
    conn = resolve_connection(args, conn_env, conn_toml, url_optional=bool(record), config_path=path)
    values.setdefault("spool_dir", default_spool_dir(env))
    values["spool_dir"] = os.path.expanduser(values["spool_dir"])
    if record:
        values["record"] = os.path.expanduser(record)
    if not values.get("host"):
        values["host"] = socket.gethostname()
    if "tenants" in data:
        from gpulse.agent.tenants_config import parse_tenants

        values["tenant_routes"], values["tenant_connections"] = parse_tenants(
            data["tenants"], f"config file {path}", conn
        )
    cfg = AgentConfig(connection=conn, config_path=path, unused_url=unused_url, **values)
    validate(cfg)
    return cfg


def record_only(
    record_from: str, url_flag: bool, env: Mapping[str, str], toml: Mapping[str, Any], path: str | None
) -> tuple[Mapping[str, str], Mapping[str, Any], str | None]:
    """The environment and ``[connection]`` table the connection is read from, and the URL left unused.

    Recording is recording: a record file set in one place (a flag, the environment, the file) sends to a
    database only when a URL is set in the same or a stronger place. ``--record FILE`` with
    ``GPULSE_URL`` exported (as the README's database section does) writes only FILE; ``--record FILE
    --url URL`` writes both. The URL left unused is said at start, never silently dropped."""
    if record_from == "flag" and env.get("GPULSE_URL"):
        unused = f"GPULSE_URL={env['GPULSE_URL']}"
        env = {k: v for k, v in env.items() if k != "GPULSE_URL"}
        return env, {k: v for k, v in toml.items() if k != "url"}, unused
    if record_from in ("flag", "env") and toml.get("url"):
        return env, {k: v for k, v in toml.items() if k != "url"}, f"url in {path}"
    return env, toml, None


def validate(cfg: AgentConfig) -> None:
    """Range checks that need more than one value's type."""
    if cfg.interval < MIN_INTERVAL_S:
        raise ConfigError(
            f"--interval {cfg.interval:g}s is below the minimum of {MIN_INTERVAL_S:g}s "
            "(NVML's utilisation counters do not refresh faster)"
        )
    if cfg.simulate is not None and not 1 <= cfg.simulate <= 1024:
        raise ConfigError(f"--simulate must be a number of GPUs between 1 and 1024, not {cfg.simulate}")
    if cfg.simulate_model not in SIMULATE_MODELS:
        raise ConfigError(f"--simulate-model must be one of {', '.join(SIMULATE_MODELS)}, not {cfg.simulate_model!r}")
    if cfg.max_lines < 1:
        raise ConfigError(f"max_lines must be at least 1, not {cfg.max_lines}")
    if cfg.self_metrics_interval < cfg.interval:
        raise ConfigError("self_metrics_interval must not be shorter than the sampling interval")
    if cfg.live_window_steps < 2 or cfg.live_window_s <= 0 or cfg.live_every_s <= 0:
        raise ConfigError(
            "the live window needs live_window_steps >= 2 and positive live_window_s and live_every_s, not "
            f"{cfg.live_window_steps}, {cfg.live_window_s:g}, {cfg.live_every_s:g}"
        )
    if cfg.socket_group is not None:
        import grp

        try:
            grp.getgrnam(cfg.socket_group)
        except KeyError:
            raise ConfigError(f"--socket-group {cfg.socket_group!r}: no such group on this machine") from None
    if not cfg.host or any(c in cfg.host for c in "\n\r"):
        raise ConfigError(f"--host must be a non-empty single-line name, not {cfg.host!r}")


def setting_names() -> tuple[str, ...]:
    """Every agent setting, in the order the example file lists them."""
    return tuple(f.name for f in fields(AgentConfig) if f.name in _SETTINGS)
