"""Where a command's database connection comes from: flags, ``GPULSE_*`` environment, the config file.

One rule for every command that talks to a database (agent, setup, doctor, report, demo, upload,
recompute): **flags > environment > config file (``--config`` or ``GPULSE_CONFIG``, its
``[connection]`` table) > defaults**. The token comes only from ``--token-file`` (or ``token_file``
in the file / ``GPULSE_TOKEN_FILE``) or from the ``GPULSE_TOKEN`` environment variable: never from a
flag value, and it is never logged.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulse.influx.connection import (
    APIS,
    DEFAULT_BUCKET,
    DEFAULT_ORG,
    DEFAULT_URL,
    DEFAULT_URL_V3,
    ConfigError,
    Connection,
    default_url,
)

#: keys allowed in the config file's ``[connection]`` table (a token itself is refused by resolve_connection)
CONNECTION_KEYS = ("url", "api", "org", "bucket", "token_file")


def config_path(args: argparse.Namespace | None, env: Mapping[str, str]) -> str | None:
    """The config file named by ``--config``, else by ``GPULSE_CONFIG``; ``None`` without one."""
    return (getattr(args, "config", None) if args is not None else None) or env.get("GPULSE_CONFIG") or None


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """``--config`` and the connection flags, for every command that talks to a database."""
    g = parser.add_argument_group("database connection (shared by every command)")
    g.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file with a [connection] table (and the agent's [agent] table); env GPULSE_CONFIG",
    )
    g.add_argument(
        "--url", help=f"InfluxDB URL (default {DEFAULT_URL}, with --api v3 {DEFAULT_URL_V3}; env GPULSE_URL)"
    )
    g.add_argument(
        "--api",
        choices=APIS,
        help="v2 (default: InfluxDB 2.x, Cloud), v1 (InfluxDB 1.x) or v3 (InfluxDB 3 Core/Enterprise); env GPULSE_API",
    )
    g.add_argument("--org", help=f"organisation (v2; default {DEFAULT_ORG}; env GPULSE_ORG)")
    g.add_argument(
        "--bucket",
        help=f"bucket (v2), database[/retention-policy] (v1) or database (v3) (default {DEFAULT_BUCKET}; env GPULSE_BUCKET)",
    )
    g.add_argument(
        "--token-file",
        help="file holding the API token (v2, v3) or user:password (v1); env GPULSE_TOKEN_FILE, or the token itself in GPULSE_TOKEN",
    )


def read_token_file(path: str | os.PathLike[str]) -> str:
    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode
        text = p.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ConfigError(f"token file {p} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read token file {p}: {e.strerror}") from None
    if not text:
        raise ConfigError(f"token file {p} is empty")
    if "\n" in text:
        raise ConfigError(f"token file {p} must hold the token on one line")
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        who = "other users" if mode & stat.S_IROTH else "its group"
        logging.getLogger("gpulse").warning(
            "token file %s is readable by %s (mode %04o); chmod 600 it", p, who, stat.S_IMODE(mode)
        )
    return text


def check_url(url: str) -> str:
    """The URL without a trailing slash; a ConfigError for anything but ``http(s)://host[:port][/path]``.

    Credentials in it (``http://user:password@host``) are refused, not silently dropped: they would be
    echoed in logs, ``gpulse status``, ``doctor``, ``--check`` and ``ps``, and never sent."""
    from gpulse.influx.http import parse_url  # the HTTP stack loads when a URL is given, not for --help

    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        if "@" in url:  # never echo what may be a password
            raise ConfigError("--url must start with http:// or https://")
        raise ConfigError(f"--url must start with http:// or https://, not {url!r}")
    try:
        parse_url(url)
    except ValueError as e:
        raise ConfigError(f"--url: {e}") from None
    return url


def resolve_connection(
    args: argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
    toml: Mapping[str, Any] | None = None,
    *,
    url_optional: bool = False,
    config_path: str | None = None,
) -> Connection:
    """Merge TOML (the ``[connection]`` table of ``config_path``) < environment < flags into a :class:`Connection`."""
    env = os.environ if env is None else env
    toml = toml or {}
    a = vars(args) if args is not None else {}

    def pick(name: str, default: Any) -> Any:
        if a.get(name) is not None:
            return a[name]
        ev = env.get(f"GPULSE_{name.upper()}")
        if ev:
            return ev
        if toml.get(name) is not None:
            return toml[name]
        return default

    api = pick("api", "v2")
    if api not in APIS:
        raise ConfigError(f"--api must be v2, v1 or v3, not {api!r}")
    url = pick("url", None if url_optional else default_url(api))
    org = pick("org", DEFAULT_ORG)
    bucket = pick("bucket", DEFAULT_BUCKET)
    if not bucket:
        raise ConfigError("--bucket must not be empty")
    if "token" in toml:
        raise ConfigError("put the token in a file and set token_file; a token in the TOML file is refused")
    token, source = "", ""
    token_file = a.get("token_file") or env.get("GPULSE_TOKEN_FILE") or toml.get("token_file")
    if token_file:
        token, source = read_token_file(token_file), f"file {token_file}"
    elif env.get("GPULSE_TOKEN"):
        token, source = env["GPULSE_TOKEN"].strip(), "GPULSE_TOKEN"
    if url is not None:
        url = check_url(str(url))
    conn = Connection(
        url=url, api=api, org=org, bucket=bucket, token=token, token_source=source, config_path=config_path
    )
    if api == "v1":
        conn.v1_credentials  # noqa: B018 - validates the token shape early
    return conn
