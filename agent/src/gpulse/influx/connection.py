"""The database connection flags every command shares: --url --api --org --bucket --token-file.

Precedence: TOML file (``[connection]`` table) < ``GPULSE_*`` environment < flags. The token
comes only from ``--token-file`` (or ``token_file`` in TOML / ``GPULSE_TOKEN_FILE``) or from the
``GPULSE_TOKEN`` environment variable: never from a flag value, and it is never logged
(``repr`` hides it).

For ``--api v1`` the bucket is ``database`` or ``database/retention-policy`` (as InfluxDB's
own 1.x compatibility API spells it) and the token, if any, is ``user:password``.
"""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8086"
DEFAULT_ORG = "gpulse"
DEFAULT_BUCKET = "gpulse"
APIS = ("v2", "v1")


class ConfigError(Exception):
    """A configuration problem the user must fix; the message says how."""


@dataclass(frozen=True)
class Connection:
    url: str | None = DEFAULT_URL
    api: str = "v2"
    org: str = DEFAULT_ORG
    bucket: str = DEFAULT_BUCKET
    token: str = field(default="", repr=False)
    token_source: str = ""  # where the token came from, safe to log
    timeout_s: float = 10.0
    verify_ssl: bool = True

    @property
    def database(self) -> str:
        """v1: the database part of ``bucket``."""
        return self.bucket.split("/", 1)[0]

    @property
    def retention_policy(self) -> str:
        """v1: the retention policy part of ``bucket`` ('' means the database default)."""
        parts = self.bucket.split("/", 1)
        return parts[1] if len(parts) == 2 else ""

    @property
    def v1_credentials(self) -> tuple[str, str] | None:
        """v1: (user, password) from a ``user:password`` token, or ``None`` without auth."""
        if not self.token:
            return None
        user, sep, password = self.token.partition(":")
        if not sep:
            raise ConfigError("for --api v1 the token must be 'user:password'")
        return user, password

    @property
    def authorization(self) -> str | None:
        """The ``Authorization`` header: Basic ``user:password`` for v1, ``Token …`` for v2; ``None`` without a token."""
        from gpulse.influx.http import basic_auth, token_auth

        if not self.token:
            return None
        if self.api == "v1":
            return basic_auth(*(self.v1_credentials or ("", "")))
        return token_auth(self.token)

    def describe(self) -> str:
        """A one-line description, safe for logs (no secret)."""
        where = self.url or "(no database: recording only)"
        auth = f"token from {self.token_source}" if self.token else "no token"
        return f"{where} api={self.api} org={self.org} bucket={self.bucket} ({auth})"


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("database connection (shared by every command)")
    g.add_argument("--url", help=f"InfluxDB URL (default {DEFAULT_URL}; env GPULSE_URL)")
    g.add_argument(
        "--api", choices=APIS, help="v2 (default: InfluxDB 2.x, 3.x, Cloud) or v1 (InfluxDB 1.x); env GPULSE_API"
    )
    g.add_argument("--org", help=f"organisation (v2; default {DEFAULT_ORG}; env GPULSE_ORG)")
    g.add_argument(
        "--bucket",
        help=f"bucket (v2) or database[/retention-policy] (v1) (default {DEFAULT_BUCKET}; env GPULSE_BUCKET)",
    )
    g.add_argument(
        "--token-file",
        help="file holding the API token (v2) or user:password (v1); env GPULSE_TOKEN_FILE, or the token itself in GPULSE_TOKEN",
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
        import logging

        who = "other users" if mode & stat.S_IROTH else "its group"
        logging.getLogger("gpulse").warning(
            "token file %s is readable by %s (mode %04o); chmod 600 it", p, who, stat.S_IMODE(mode)
        )
    return text


def check_url(url: str) -> str:
    """The URL without a trailing slash; a ConfigError for anything but ``http(s)://host[:port][/path]``.

    Credentials in it (``http://user:password@host``) are refused, not silently dropped: they would be
    echoed in logs, ``gpulse status``, ``doctor``, ``--check`` and ``ps``, and never sent."""
    from gpulse.influx.http import parse_url

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
) -> Connection:
    """Merge TOML < environment < flags into a :class:`Connection`."""
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

    url = pick("url", None if url_optional else DEFAULT_URL)
    api = pick("api", "v2")
    if api not in APIS:
        raise ConfigError(f"--api must be v2 or v1, not {api!r}")
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
    conn = Connection(url=url, api=api, org=org, bucket=bucket, token=token, token_source=source)
    if api == "v1":
        conn.v1_credentials  # noqa: B018 - validates the token shape early
    return conn
