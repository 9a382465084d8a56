"""Which server is at the URL, decided once, and what its refusals mean: the probe every command shares.

``GET /ping`` answers with ``X-Influxdb-Version`` and ``X-Influxdb-Build`` on every InfluxDB (1.x:
``services/httpd/handler.go`` ``ServeHTTP`` adds them to all responses; 2.x: the ``buildHeader``
middleware in ``http/handler.go``; 3.x: ``ping`` in ``influxdb3_server/src/http.rs``, which also answers
JSON ``{"product_name": "InfluxDB 3 Core", "version", ...}`` and ``X-Influxdb-Build: Core``, constants in
``influxdb3_server/src/lib.rs``). One request so tells whether anything answers, whether it is InfluxDB,
and which generation, before a command sends a line. InfluxDB 3 asks for the token on ``/ping`` too
(unless started with ``--disable-authz ping``: ``perform_routing`` checks the token before the route),
and its 401 carries no version header, so the probe sends the connection's credentials: 1.x and 2.x
ignore them there. With ``--api`` that decides whether the command can work at all (:meth:`ServerInfo.mismatch`).

When a server refuses a request, :func:`diagnose` says what kind of problem it is, with the fix,
so that every command (``setup``, ``upload``, ``report``, the agent's log, ``doctor``) says the
same thing: the wrong ``--api`` for this server, credentials (none given, or refused), or the
layout (a database, retention policy, bucket or org that does not exist: ``gpulse setup`` makes them).
"""

from __future__ import annotations

import enum
import ipaddress
import re
import shlex
import urllib.parse
from dataclasses import dataclass

from gpulse.influx.connection import Connection
from gpulse.influx.http import Failure, HttpClient, TransportError
from gpulse.influx.tiers import RAW, TIERS


class Problem(str, enum.Enum):
    UNREACHABLE = "unreachable"  # nothing answers at the URL
    NOT_INFLUXDB = "not influxdb"  # something answers, without InfluxDB's version header
    WRONG_API = "wrong api"  # InfluxDB of the other generation than --api
    CREDENTIALS = "credentials"  # none given where needed, or refused (401), or not allowed (403)
    LAYOUT = "layout"  # the database, retention policy, bucket or org does not exist


@dataclass(frozen=True)
class Diagnosis:
    """A problem with the server as configured: what is wrong, and what to do (safe to print: no secret)."""

    problem: Problem
    detail: str
    fix: str

    def __str__(self) -> str:
        return f"{self.detail}: {self.fix}"

    def explain(self, answer: str) -> str:
        """The diagnosis with the server's own words (``answer``) in the middle."""
        return f"{self.detail} ({answer}): {self.fix}"


class ServerProblem(Exception):
    """The server cannot serve this command as configured; ``diagnosis`` says why and what to do.

    ``heals``: asking again later may work (:func:`may_heal`); else a person has to act."""

    def __init__(self, diagnosis: Diagnosis, *, heals: bool = False) -> None:
        super().__init__(str(diagnosis))
        self.diagnosis = diagnosis
        self.heals = heals


def _loopback(url: str) -> bool:
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def may_heal(failure: Failure, url: str) -> bool:
    """Whether a request that got no answer may get one later, without anyone changing anything.

    A timeout or a connection reset may pass (a busy or restarting server, a network blip), and so may a
    refusal by another host (its InfluxDB restarting). A host name that does not resolve, a TLS failure,
    and nothing listening on this very machine (a loopback URL) stay so until a person acts."""
    if failure is Failure.REFUSED:
        return not _loopback(url)
    return failure in (Failure.TIMEOUT, Failure.BROKEN)


_VERSION = re.compile(r"v?(\d+)\.(\d+)")


@dataclass(frozen=True)
class ServerInfo:
    url: str
    version: str  # as the server spells it ("1.6.7~rc0", "v2.9.1", "dev")
    build: str  # "OSS", "ENT", "Cloud"...
    #: the ``Date`` header of the answer (the server's clock, to the second), if it sent one
    date: str | None = None
    #: InfluxDB 3's ``product_name`` from the ``/ping`` JSON ("InfluxDB 3 Core"), else ""
    product: str = ""

    @property
    def api(self) -> str:
        """The API generation this server speaks natively: ``v1`` for InfluxDB 1.x, ``v3`` for 3.x, else ``v2``."""
        major = self.version.lstrip("v").split(".", 1)[0]
        return {"1": "v1", "3": "v3"}.get(major, "v2")

    @property
    def edition(self) -> str:
        """InfluxDB 3's edition, ``core`` or ``enterprise`` (from the build header or the product name); else ""."""
        if self.api != "v3":
            return ""
        return "enterprise" if "enterprise" in f"{self.build} {self.product}".lower() else "core"

    def describe(self) -> str:
        """``InfluxDB 3 Core 3.10.0``, ``InfluxDB v2.9.1``: the product and version as the server names them."""
        return f"{self.product} {self.version}" if self.product else f"InfluxDB {self.version}"

    def serves(self, api: str, *, admin: bool = False) -> bool:
        """Whether ``--api api`` can work here: natively, or (not for setup's ``admin`` calls) through
        the other generation's compatibility endpoints: 1.8+ serves ``/api/v2/write`` (``serveWriteV2``
        in 1.8's ``services/httpd/handler.go``), 2.x serves ``/write`` and ``/query`` (``http/legacy``),
        3.x serves ``/write``, ``/api/v2/write`` and ``/query`` (``influxdb3_server/src/all_paths.rs``);
        only 3.x serves ``/api/v3``."""
        if api == self.api:
            return True
        if admin or api == "v3":
            return False
        if api == "v2":  # a 1.x server: the v2 write endpoint exists from 1.8 on
            m = _VERSION.match(self.version)
            return m is not None and (int(m.group(1)), int(m.group(2))) >= (1, 8)
        return True

    def mismatch(self, api: str, *, admin: bool = False) -> Diagnosis | None:
        """``None`` when ``--api api`` can work with this server, else what to use instead."""
        if self.serves(api, admin=admin):
            return None
        return wrong_api(self)


def wrong_api(info: ServerInfo) -> Diagnosis:
    """The message ``gpulse setup`` made known, for every command."""
    if info.api == "v1":
        use = "use --api v1 (with --token-file holding user:password)"
    elif info.api == "v3":
        use = "use --api v3 (with --token-file holding an InfluxDB 3 token)"
    else:
        use = "use --api v2 (with --token-file holding an API token)"
    return Diagnosis(Problem.WRONG_API, f"{info.url} is {info.describe()}", use)


# -- the probe ---------------------------------------------------------------------------------------
def probe(
    url: str, *, timeout_s: float = 10.0, verify_tls: bool = True, authorization: str | None = None
) -> ServerInfo:
    """``GET /ping`` with ``authorization`` (InfluxDB 3 asks for it): the server's version, or
    :class:`ServerProblem` (unreachable, not InfluxDB, or InfluxDB 3 refusing the credentials)."""
    try:
        with HttpClient(url, timeout_s=timeout_s, verify_tls=verify_tls, authorization=authorization) as client:
            r = client.request("GET", "/ping")
    except TransportError as e:
        raise ServerProblem(unreachable(e), heals=may_heal(e.failure, url)) from None
    version = r.header("X-Influxdb-Version")
    if not version and r.status == 401:
        raise ServerProblem(
            Diagnosis(
                Problem.CREDENTIALS,
                f"{url} asks for credentials on /ping (as InfluxDB 3 does) and "
                + ("refused the ones given" if authorization else "none were given"),
                "",  # probe_connection says where credentials come from and what to put there
            )
        )
    if not version and r.status == 403 and authorization:  # InfluxDB 3 Enterprise: a token not allowed to ping
        raise ServerProblem(
            Diagnosis(
                Problem.CREDENTIALS,
                f"{url} knows the token but does not let it ask /ping (HTTP 403; on InfluxDB 3 Enterprise a "
                "token needs the permission system:ping:read, which the tokens gpulse setup makes have)",
                "",
            )
        )
    if not version and (r.status >= 500 or r.status == 429):  # a proxy whose InfluxDB is down or busy
        raise ServerProblem(
            Diagnosis(
                Problem.UNREACHABLE,
                f"{url} answered /ping with HTTP {r.status} (not InfluxDB itself: a proxy in front of it?)",
                "is InfluxDB running behind it? Start it, or point gpulse at yours with --url (or GPULSE_URL)",
            ),
            heals=True,
        )
    if not version:
        raise ServerProblem(
            Diagnosis(
                Problem.NOT_INFLUXDB,
                f"{url} answered /ping with HTTP {r.status} and no X-Influxdb-Version header: it is not InfluxDB",
                "check --url (InfluxDB listens on port 8086 by default, InfluxDB 3 on 8181)",
            )
        )
    product = ""
    if version.startswith("3."):
        try:
            doc = r.json()
        except ValueError:
            doc = None
        product = str(doc.get("product_name") or "") if isinstance(doc, dict) else ""
    return ServerInfo(url, version, r.header("X-Influxdb-Build") or "", r.header("Date"), product)


def probe_with(conn: Connection) -> ServerInfo:
    """:func:`probe` with ``conn``'s URL, deadline, TLS check and credentials; a refusal of those said for ``conn``."""
    try:
        return probe(
            conn.url or "", timeout_s=conn.timeout_s, verify_tls=conn.verify_ssl, authorization=conn.authorization
        )
    except ServerProblem as e:
        if e.diagnosis.problem is not Problem.CREDENTIALS:
            raise
        refused = refused_credentials(conn, 401)
        raise ServerProblem(Diagnosis(Problem.CREDENTIALS, e.diagnosis.detail, refused.fix)) from None


def probe_connection(conn: Connection, *, admin: bool = False) -> ServerInfo:
    """The probe for ``conn``, and the verdict on its ``--api``: :class:`ServerProblem` if it cannot work."""
    info = probe_with(conn)
    wrong = info.mismatch(conn.api, admin=admin)
    if wrong is not None:
        raise ServerProblem(wrong)
    return info


def unreachable(e: TransportError) -> Diagnosis:
    return Diagnosis(
        Problem.UNREACHABLE,
        str(e),
        "is InfluxDB running there? Start it, or point gpulse at yours with --url (or GPULSE_URL)",
    )


# -- what a refusal means ----------------------------------------------------------------------------
#: where credentials can come from, for a message that says none came
NONE_GIVEN = "none were given (no --token-file, GPULSE_TOKEN_FILE, token_file in --config, nor GPULSE_TOKEN)"


def credentials_given(conn: Connection) -> str:
    """Which credentials a request carried and where they came from (never the secret), or that none did."""
    if not conn.token:
        return f"no credentials: {NONE_GIVEN}"
    what = "user:password" if conn.api == "v1" else "token"
    return f"the credentials ({what}) from {conn.token_source or 'the configuration'}"


def credentials_fix(conn: Connection) -> str:
    if conn.api == "v1":
        return (
            "put user:password of an InfluxDB 1.x user with access to the database in a file, "
            "chmod 600 it, and pass --token-file FILE (or set GPULSE_TOKEN_FILE)"
        )
    if conn.api == "v3":
        return (
            "put an InfluxDB 3 token (an admin token on Core) with access to the database in a file, chmod 600 it, "
            "and pass --token-file FILE (or set GPULSE_TOKEN_FILE)"
        )
    return (
        "put an InfluxDB API token with access to the bucket in a file, chmod 600 it, and pass "
        "--token-file FILE (or set GPULSE_TOKEN_FILE); `make up` writes the admin token to secrets/influxdb-admin-token"
    )


def refused_credentials(conn: Connection, status: int) -> Diagnosis:
    """A 401 (no or wrong credentials) or 403 (not allowed), said with where the credentials came from."""
    if status == 403:
        detail = f"InfluxDB at {conn.url} does not allow {credentials_given(conn)} to do this"
    elif conn.token:
        detail = f"InfluxDB at {conn.url} refused {credentials_given(conn)}"
    else:
        detail = f"InfluxDB at {conn.url} asks for credentials and {NONE_GIVEN}"
    return Diagnosis(Problem.CREDENTIALS, detail, credentials_fix(conn))


def _setup_fix(conn: Connection) -> str:
    return f"run `{shlex.join(['gpulse', 'setup', *conn.command_flags()])}` (it creates what is missing)"


def missing_retention_policy(conn: Connection) -> Diagnosis:
    made = ", ".join([f"{RAW} (the default)", *(t.name for t in TIERS)])
    return Diagnosis(
        Problem.LAYOUT,
        f"retention policy {conn.retention_policy!r} does not exist on database {conn.database!r}",
        f"name one that does in --bucket {conn.database}/POLICY, or give --bucket {conn.database} for the "
        f"database's default (`gpulse setup --api v1` makes {made})",
    )


def missing_database(conn: Connection) -> Diagnosis:
    return Diagnosis(Problem.LAYOUT, f"database {conn.database!r} does not exist on {conn.url}", _setup_fix(conn))


def missing_bucket(conn: Connection) -> Diagnosis:
    return Diagnosis(
        Problem.LAYOUT,
        f"bucket {conn.bucket!r} does not exist in org {conn.org!r}",
        f"{_setup_fix(conn)}, or check --bucket",
    )


def missing_org(conn: Connection) -> Diagnosis:
    return Diagnosis(
        Problem.LAYOUT,
        f"org {conn.org!r} does not exist on {conn.url}",
        "check --org (the compose stack's org is in .env)",
    )


def diagnose(conn: Connection, status: int, message: str, info: ServerInfo | None = None) -> Diagnosis | None:
    """What a server's refusal (``status``, its error ``message``) means for ``conn``; ``None`` if nothing known.

    ``info`` (the probe's answer) lets a 401 or 404 from the other generation's server say "wrong --api"
    instead of a misleading "bad credentials" or "not found". The messages matched are the servers' own:
    1.x ``database not found: "db"`` (404, ``serveWrite``), ``retention policy not found: rp``
    (``errors.go`` ``ErrRetentionPolicyNotFound``: a 500 on a write, a result error on a query);
    2.x ``bucket "b" not found`` / ``organization name "o" not found`` (404).
    """
    if info is not None and status in (401, 403, 404):
        wrong = info.mismatch(conn.api)
        if wrong is None and info.api != conn.api:
            wrong = wrong_api(info)  # served through compatibility endpoints, but refused there: say so
        if wrong is not None:
            return wrong
    text = message.lower()
    if "retention policy not found" in text:
        return missing_retention_policy(conn)
    if "database not found" in text:
        return missing_database(conn)
    if status in (401, 403):
        return refused_credentials(conn, status)
    if status == 404 and "bucket" in text and "not found" in text:
        return missing_bucket(conn)
    if status == 404 and "organization" in text and "not found" in text:
        return missing_org(conn)
    return None


class Explainer:
    """Explains one connection's refusals (:func:`diagnose`), asking ``/ping`` at most once, at the first one
    that needs it; a command that probed already hands its answer over in ``info``."""

    def __init__(self, conn: Connection, info: ServerInfo | None = None) -> None:
        self.conn = conn
        self.info = info
        self._asked = info is not None

    def diagnose(self, status: int, message: str) -> Diagnosis | None:
        if not self._asked and status in (401, 403, 404):
            self._asked = True
            try:
                self.info = probe_with(self.conn)
            except ServerProblem:
                pass
        return diagnose(self.conn, status, message, self.info)
