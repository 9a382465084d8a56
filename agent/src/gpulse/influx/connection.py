"""The typed database connection every command talks through: URL, API, org, bucket, credentials.

Read from flags, environment and config file by :mod:`gpulse.agent.connection_config`; here only the
record, what it means (v1 database and retention policy, the ``Authorization`` header), an HTTP client
for it, and the flags that name it again in advice. The token is never shown (``repr`` hides it).
Every command loads this record (``gpulse status`` too, for :class:`ConfigError`), so the HTTP stack
(:mod:`gpulse.influx.http`, which knows nothing of this record) is imported only where a request is made.

For ``--api v1`` the bucket is ``database`` or ``database/retention-policy`` (as InfluxDB's
own 1.x compatibility API spells it) and the token, if any, is ``user:password``. For ``--api v3``
(InfluxDB 3 Core/Enterprise) the bucket is the raw database and the token an InfluxDB 3 token; the
server listens on 8181 there (``DEFAULT_HTTP_BIND_ADDR`` in ``influxdb3/src/commands/serve.rs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulse.influx.http import HttpClient

DEFAULT_URL = "http://127.0.0.1:8086"
DEFAULT_URL_V3 = "http://127.0.0.1:8181"
DEFAULT_ORG = "gpulse"
DEFAULT_BUCKET = "gpulse"
APIS = ("v2", "v1", "v3")


def default_url(api: str) -> str:
    """Where InfluxDB listens unless told otherwise: 8181 for InfluxDB 3, 8086 for 1.x and 2.x."""
    return DEFAULT_URL_V3 if api == "v3" else DEFAULT_URL


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
    #: the config file the settings were read with, if any (advice names it again)
    config_path: str | None = field(default=None, compare=False)
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
        """The ``Authorization`` header: Basic ``user:password`` for v1, ``Token …`` for v2 and v3 (InfluxDB 3
        takes ``Token`` and ``Bearer``: ``validate_auth_header`` in ``influxdb3_server/src/http.rs``); ``None``
        without a token."""
        from gpulse.influx.http import basic_auth, token_auth  # the HTTP stack only where a request is made

        if not self.token:
            return None
        if self.api == "v1":
            return basic_auth(*(self.v1_credentials or ("", "")))
        return token_auth(self.token)

    def describe(self) -> str:
        """A one-line description, safe for logs (no secret)."""
        where = self.url or "(no database: recording only)"
        auth = f"token from {self.token_source}" if self.token else "no token"
        dest = f"database={self.bucket}" if self.api == "v3" else f"org={self.org} bucket={self.bucket}"
        return f"{where} api={self.api} {dest} ({auth})"

    def http_client(self, *, timeout_s: float | None = None, max_body: int | None = None) -> HttpClient:
        """A client for this connection: its URL, credentials, deadline and TLS check (``timeout_s`` and
        ``max_body`` override the connection's deadline and the client's default answer cap)."""
        from gpulse.influx.http import DEFAULT_MAX_BODY, HttpClient

        return HttpClient(
            self.url or "",
            authorization=self.authorization,
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
            verify_tls=self.verify_ssl,
            max_body=DEFAULT_MAX_BODY if max_body is None else max_body,
        )

    def command_flags(self) -> list[str]:
        """The flags that name this connection again in a printed command: ``--config`` when the
        settings came from a file, then every value that differs from the defaults (the token by the
        file it came from; a token from the environment stays there)."""
        flags = ["--config", self.config_path] if self.config_path else []
        flags += ["--url", self.url or default_url(self.api)]
        if self.api != "v2":
            flags += ["--api", self.api]
        if self.api == "v2" and self.org != DEFAULT_ORG:
            flags += ["--org", self.org]
        if self.bucket != DEFAULT_BUCKET:
            flags += ["--bucket", self.bucket]
        if self.token_source.startswith("file "):
            flags += ["--token-file", self.token_source.removeprefix("file ")]
        return flags
