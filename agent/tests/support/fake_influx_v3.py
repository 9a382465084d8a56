"""A stand-in for an InfluxDB 3 Core / Enterprise server (no InfluxDB 3 can run in CI), for what gpulse talks to.

It follows the server's code (``influxdata/influxdb`` 3.10 nightly, d7834110), not its docs; each
behaviour names the source file and function it comes from. Short names: **H** =
``influxdb3_server/src/http.rs``, **S** = ``influxdb3/src/commands/serve.rs``, **V** =
``influxdb3_write/src/write_buffer/validator.rs``. The real server listens on 8181 (S
``DEFAULT_HTTP_BIND_ADDR``); this one on a free loopback port.

**Routing** (H ``perform_routing``, paths from ``influxdb3_server/src/all_paths.rs``): the token is checked
*before* the route, so an unknown path answers 401 without a token and 404 ``Not found`` (plain text)
with one; ``/api/v2/{setup,orgs,buckets,dbrps,tasks,authorizations,query}`` have no route (no Flux, no
tasks). Every answer carries ``cluster-uuid`` (H ``route_request``).

**Tokens** (H ``authenticate_request``, ``validate_auth_header``, ``extract_v1_auth_token``): ``Token``,
``Bearer``, or ``Basic`` with the token as the password; ``p=`` on ``/query`` and ``/write``; none or an
unknown one -> 401 ``{"error": "the request was not authenticated"}``; another scheme or more parts ->
400 (``AuthenticationError::MalformedRequest``). ``/ping`` and ``/health`` need the token too unless
``disable_authz`` names them (S ``--disable-authz``, ``influxdb3_commands/src/helpers.rs``
``DisableAuthzList``: ``health`` opens ``/health`` and ``/api/v1/health``). ``without_auth`` is
``--without-auth``. What each token may do is :mod:`support.authz_v3` (``influxdb3_authz``): every route
asks it (a write: ``write`` on the database; InfluxQL and SQL: ``read``; ``/ping``, ``/health``:
``system:ping:read``, ``system:health:read``; the rest: the admin token), a refusal is 403 with an empty
body (H ``Error::ResourceAuthorization``), on ``/query`` 401 ``{"error": "unauthorized access"}``. Core has
only admin tokens (``_admin``, ``*:*:*``); Enterprise makes resource tokens through ``POST
/api/v3/enterprise/configure/token`` (a route Core does not have: 404 there), and both delete one with
``DELETE /api/v3/configure/token?token_name=`` and list them in ``system.tokens`` (``_internal``).

**Probes** (H ``ping``, ``health``): ``/ping`` (GET/POST) 200 JSON ``{"product_name", "version",
"revision", "process_id"}`` with ``X-Influxdb-Build`` and ``X-Influxdb-Version: 3.10.0-nightly``;
``/health`` (GET) 200 ``OK`` as ``text/plain``.

**Writes** (H ``write_lp_inner``, ``read_body``; V ``v1_parse_lines_and_catalog_updates``):

* ``/write?db=D[&rp=R]``: database ``D/R`` (``autogen`` is ``D``; ``core/iox_http/src/write/single_tenant/mod.rs``
  ``parse_v1``); ``/api/v2/write?bucket=B``: database ``B``, ``org`` ignored (``parse_v2``); both force
  ``accept_partial=false`` (``influxdb3_types/src/http.rs`` ``From<iox_http::write::WriteParams>``):
  the first bad line rejects the batch, nothing is written. ``/write`` answers 400
  ``{"error": "line protocol parsing error", "data": {"error_message", "line_number", "original_line"}}``,
  ``data`` an object, ``original_line`` cut to 20 bytes (``influxdb3_types/src/write.rs``
  ``WriteLineError``); ``/api/v2/write`` answers 400 ``{"code": "invalid", "message": "write buffer
  error: line protocol parse failed: <why>"}`` without a line number (H ``V2WriteApiError``);
* ``/api/v3/write_lp?db=&precision=&accept_partial=`` (default true): the good lines are written, and
  400 ``{"error": "partial write of line protocol occurred", "data": [<each bad line>]}``, 422 when one
  of them hit a limit (H ``Error::PartialLpWrite``);
* 204 on success; a database is created by its first write (V ``WriteValidator::initialize``) unless
  that exceeds the database limit (5 Core, 100 Enterprise: S ``CORE_NUM_DBS_LIMIT``) -> 422
  ``{"error": "Adding a new database would exceed limit of 5 databases"}`` (``/api/v2/write``: 400
  ``invalid``);
* a table may hold 500 tag and field columns (S ``CORE_NUM_COLUMNS_PER_TABLE_LIMIT``,
  ``influxdb3_catalog/src/catalog/versions/v3/transaction.rs`` ``check_columns_limit``): the line that
  would add one more fails with ``Update to schema would exceed number of columns per table limit of
  500 columns``: 400 on the legacy endpoints, 422 on ``write_lp`` with partial writes; a field whose type
  differs from its column's (or a tag's name) fails with ``invalid column type for column 'f', expected
  iox::column_type::field::float, got iox::column_type::field::integer`` (``transaction.rs``
  ``column_or_create``, ``CatalogError::InvalidColumnType``), 400;
* the body, after gzip, at most ``max_request_bytes`` (``--max-http-request-size``, 10 MiB) -> else 413
  ``max request size (N bytes) exceeded`` (plain text); another ``Content-Encoding`` -> 400
  ``unacceptable content-encoding: X``; a bad gzip stream -> 400 ``error decoding gzip stream: ...``;
* a database name is ASCII letters, digits, ``_``, ``-`` and at most one ``/`` not at the end, starting
  with a letter or digit (H ``validate_db_name``) -> else 400 ``{"error": "..."}``;
* precision: ``second``/``s``, ``millisecond``/``ms``, ``microsecond``/``us``/``u``, ``nanosecond``/``ns``/``n``
  on all three (``core/iox_http/src/write/params.rs``; legacy default ``ns``); ``write_lp`` also ``auto``, its
  default: the unit guessed from the timestamp's size (``influxdb3_types/src/write.rs`` ``guess_precision``);
* ``/write`` without parameters: 400 ``{"error": "no db destination provided"}``, without ``db`` or with an
  unknown precision ``failed to deserialize db/rp/precision in request: ...`` (``write/v1.rs``
  ``V1WriteParseError``; the tail of serde's words approximated); ``/api/v2/write`` likewise as
  ``{"code": "invalid", "message": ...}``, an empty ``bucket`` ``missing bucket value``.

**Databases** (H ``create_database``, ``update_database``, ``show_databases``, ``delete_database``):
``POST /api/v3/configure/database {"db", "retention_period": "30d"}`` (JSON only: another
``Content-Type`` is 415, H ``read_body_json``; 409 when it exists, 422 over the limit); ``PUT`` sets or
(without ``retention_period``) clears the retention period; ``GET ?format=json`` lists
``{"iox::database": name}`` rows (no ``format`` -> 400 ``serde error: missing field `format```);
``DELETE ?db=`` soft-deletes (404 ``Database not found <db>`` when there is none). Retention is
recorded, not enforced.

**Plugins and triggers** (H ``create_plugin_file``, ``update_plugin_file``,
``configure_processing_engine_trigger``; ``influxdb3_processing_engine/src/lib.rs``;
``influxdb3_catalog/src/catalog/versions/v3/catalog.rs`` ``create_processing_engine_trigger``): admin
tokens only; ``POST /api/v3/plugins/files {"plugin_name", "content"}`` writes a plugin file; ``PUT``
replaces the file *of the trigger named* ``plugin_name`` (none -> 500 ``... Plugin not found: X``).
``POST /api/v3/configure/processing_engine_trigger {"db", "plugin_filename", "trigger_name",
"trigger_specification", "trigger_settings": {"run_async", "error_behavior"}, "trigger_arguments",
"disabled"}``: a plugin file that does not exist -> 500; then the specification is parsed
(``influxdb3_catalog/src/log/versions/v2.rs`` ``from_string_rep``: ``table:<t>``, ``all_tables``,
``cron:<6 or 7 fields, seconds first>``, ``every:<duration>`` up to a year, ``request:<path>``) ->
500 ``failed to parse trigger from <spec>[: why]``; then the database -> 404 ``Database not found
<db>``; a trigger of that name -> 409; 200. Plugin files live in a temporary ``--plugin-dir``; a name
that leaves it is refused (``validate_path_within_plugin_dir``). ``GET|POST /api/v3/engine/<path>`` runs
the ``request:<path>`` trigger's ``process_request`` (H ``processing_engine_request_plugin``;
``influxdb3_processing_engine/src/plugins.rs``: the call's writes are applied before the answer, a
plugin that raises answers 500 ``{"error": ...}``, no such trigger 404 ``{error: "not found"}``, not
JSON). Scheduled triggers do not tick by themselves: :meth:`FakeInfluxV3.run_trigger` runs one tick.

**System tables** on ``GET /api/v3/query_sql?db=&q=&format=json`` (H ``query_sql``;
``influxdb3_system_tables/src/lib.rs`` ``AllSystemSchemaTablesProvider``): ``SELECT * FROM system.<t>``
for ``databases`` and ``plugin_files`` (database ``_internal`` only) and ``processing_engine_triggers``,
``processing_engine_trigger_arguments`` (of the database named), with those files' columns
(``databases.rs``, ``plugins.rs``: the files of triggers only, ``python_call.rs``); JSON rows with null
columns left out (arrow's JSON writer). Any other SQL runs on the database's tables in DataFusion.
``DELETE /api/v3/configure/processing_engine_trigger?db=&trigger_name=&force=true`` deletes a trigger
(H ``delete_processing_engine_trigger``; none -> 404, the catalog's words approximated).

**InfluxQL** on ``/query`` (``core/iox_v1_query_api/src/handler.rs``; ``iox_query_influxql_rewrite``
``resolve_dbrp``): the database is ``"db"."rp"`` in the query as ``db/rp``, else the ``db`` parameter;
a retention policy without a database (``FROM "1h"."gpu"``) and the ``rp=`` parameter are dropped: the
raw table is read. A database that does not exist is ``Database <db> not found`` (handler
``plan_query``, ``Error::DatabaseNotFound``). The statements answered are exactly those of
:mod:`support.influxql_v3` (``SHOW DATABASES``; ``SELECT`` of ``*``, columns, ``first``/``last`` with
time and tag conditions; ``SHOW TAG VALUES ... WITH KEY``), planned there onto DataFusion SQL and run
on the stored tables (:mod:`support.engine_v3`); the answer is the 1.x JSON shape, one series
``{"name", "columns", "values"}`` per statement with ``time`` in integer nanoseconds whatever ``epoch``
says (gpulse always asks ``epoch=ns``; no ``GROUP BY``, so no ``tags`` object). Errors come back
inside ``results`` with 200, as the handler's ``error_statement`` does.

**Parquet files and the query file limit** (``influxdb3_write/src/write_buffer/mod.rs``
``get_table_chunks``): :meth:`FakeInfluxV3.snapshot` persists what was written since the last one: one
file per table per 10-minute block of data time that got points (``--gen1-duration``), so rewriting a
block adds a file; Core never compacts. A query on a table whose files in its time range number more
than ``query_file_limit`` (432) fails with ``Query would scan 432 Parquet files, exceeding the file
limit. ...``: the message prints the limit, not the count.

Where it differs: which lines are refused, and the words of ``error_message``, come from the 1.x/2.x
parser port (:mod:`support.influx_points`), not from IOx's ``influxdb_line_protocol`` crate; line
numbers count non-blank, non-comment lines; retention
is not enforced; which permission Enterprise's own endpoints ask is not public (see
:mod:`support.authz_v3`: the admin token where unknown); the processing engine does not run on its own (tests run triggers with
:mod:`support.engine_v3`); only the InfluxQL subset of :mod:`support.influxql_v3` is answered (others:
an in-band error); ``epoch`` other than ``ns`` is not honoured.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

from . import authz_v3 as authz
from . import influxql_v3 as influxql
from .engine_v3 import Engine, QueryError, load_plugin
from .influx_points import parse_points

VERSION = "3.10.0-nightly"  # Cargo.toml workspace version
DEFAULT_PORT = 8181  # S DEFAULT_HTTP_BIND_ADDR
MIB = 1024 * 1024
GEN1_BLOCK_NS = 10 * 60 * 10**9  # --gen1-duration default
DB_LIMIT = {"core": 5, "enterprise": 100}  # S CORE_NUM_DBS_LIMIT; Enterprise per the research notes
COLUMN_LIMIT = 500  # S CORE_NUM_COLUMNS_PER_TABLE_LIMIT
UNAUTHENTICATED = {"error": "the request was not authenticated"}
UNAUTHORIZED_QUERY = {"error": "unauthorized access"}  # H IntoResponse for iox_v1_query_api::HttpError
MALFORMED_AUTH = {
    "error": "Authorization header was malformed, the request was not in the form of 'Authorization: "
    "<auth-scheme> <token>', supported auth-schemes are Bearer, Token and Basic"
}
#: write_lp precision names (influxdb3_types/src/write.rs Precision and its serde aliases) -> ns multiplier
V3_PRECISION = {"auto": 0, "second": 10**9, "s": 10**9, "millisecond": 10**6, "ms": 10**6}
V3_PRECISION |= {"microsecond": 1000, "us": 1000, "u": 1000, "nanosecond": 1, "ns": 1, "n": 1}
#: /write and /api/v2/write (core/iox_http/src/write/params.rs Precision: no auto, default ns)
LEGACY_PRECISION = {k: v for k, v in V3_PRECISION.items() if k != "auto"}
FILE_LIMIT_ERROR = (
    "Query would scan {} Parquet files, exceeding the file limit. InfluxDB 3 Core caps file access to prevent "
    "performance degradation and memory issues. Use a narrower time range, or increase the limit with "
    "--query-file-limit (this may cause slower queries or instability)."
)


@dataclass
class Answer:
    status: int
    body: Any = None  # dict/list -> JSON, str -> text, None -> empty
    headers: dict[str, str] = field(default_factory=dict)


class Refused(Exception):
    """An error answer, raised where the server's handler returns one."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(str(body))
        self.answer = Answer(status, body)


@dataclass(frozen=True)
class LineError:
    """``WriteLineError``: serialized with ``original_line`` cut to 20 bytes."""

    original_line: str
    line_number: int
    error_message: str
    limit: bool = False  # a schema or database limit (makes a partial write 422)

    def json(self) -> dict[str, Any]:
        cut = self.original_line.encode()[:20].decode("utf-8", "ignore")
        return {"error_message": self.error_message, "line_number": self.line_number, "original_line": cut}


@dataclass
class Database:
    retention_period_s: int | None = None
    id: int = -1  # DbId: what a token's permission names (0 is _internal)
    deleted: bool = False
    columns: dict[str, dict[str, str]] = field(default_factory=dict)  # table -> column -> tag|<field type>


@dataclass
class Trigger:
    db: str
    name: str
    plugin_filename: str
    specification: str
    arguments: dict[str, str] | None
    settings: dict[str, Any]
    disabled: bool


# -- trigger specifications (influxdb3_catalog/src/log/versions/v2.rs from_string_rep) --------------------
_HUMANTIME = re.compile(
    r"(\d+)\s*(nsec|ns|usec|us|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|weeks|week|w|months|month|M|years|year|y)"
)
_HUMANTIME_S = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60}
_HUMANTIME_S |= {"h": 3600, "hr": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400}
_HUMANTIME_S |= {"w": 604800, "week": 604800, "weeks": 604800, "M": 2630016, "month": 2630016, "months": 2630016}
_HUMANTIME_S |= {"y": 31557600, "year": 31557600, "years": 31557600}
_HUMANTIME_S |= {"ns": 1e-9, "nsec": 1e-9, "us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3}
#: the cron crate's fields (seconds first) and their ranges; month and day-of-week also take names
_CRON_RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (1, 7), (1970, 2099))
_CRON_NAMES = {4: ("jan feb mar apr may jun jul aug sep oct nov dec"), 5: ("sun mon tue wed thu fri sat")}
_CRON_PART = re.compile(r"(\*|\?|\w+(?:-\w+)?)(?:/(\d+))?")


def cron_ok(expr: str) -> bool:
    """A ``cron`` crate schedule: 6 or 7 fields (seconds first), each ``*``, ``?``, ``a``, ``a-b`` or names,
    optionally ``/step``, comma-separated, within the field's range."""
    fields = expr.split()
    if len(fields) not in (6, 7):
        return False
    for i, f in enumerate(fields):
        lo, hi = _CRON_RANGES[i]
        names = _CRON_NAMES.get(i, "").split()
        for part in f.split(","):
            m = _CRON_PART.fullmatch(part)
            if m is None or (m[2] is not None and int(m[2]) == 0):
                return False
            if m[1] in ("*", "?"):
                continue
            for value in m[1].split("-"):
                if value.lower() in names:
                    continue
                if not value.isdigit() or not lo <= int(value) <= hi:
                    return False
    return True


def humantime_seconds(text: str) -> float:
    """``humantime::parse_duration`` (units as that crate spells them), or ValueError."""
    t, pos, total = text.strip(), 0, 0.0
    for m in _HUMANTIME.finditer(t):
        if t[pos : m.start()].strip():
            break
        total += int(m.group(1)) * _HUMANTIME_S[m.group(2)]
        pos = m.end()
    if not t or t[pos:].strip():
        raise ValueError(text)
    return total


def parse_trigger_spec(spec: str) -> str:
    """The kind of a valid specification, or :class:`Refused` 500 with the catalog's words.

    ``cron:`` is checked by :func:`cron_ok`, the ``cron`` crate's grammar without its ``L``/``W``/``#``
    extensions (refused here, so never more lenient)."""
    s = spec.strip()

    def fail(context: str | None = None) -> Refused:
        return Refused(500, f"failed to parse trigger from {s}" + (f": {context}" if context else ""))

    if s.startswith("table:"):
        if not s.removeprefix("table:").strip():
            raise fail("table name is empty")
        return "table"
    if s == "all_tables":
        return "all_tables"
    if s.startswith("cron:"):
        if not cron_ok(s.removeprefix("cron:")):
            raise fail()
        return "cron"
    if s.startswith("every:"):
        try:
            seconds = humantime_seconds(s.removeprefix("every:"))
        except ValueError:
            raise fail("couldn't parse to duration") from None
        if seconds > 31557600:
            raise fail("don't support every schedules of over 1 year")
        return "every"
    if s.startswith("request:"):
        if not s.removeprefix("request:").strip():
            raise fail()
        return "request"
    raise fail(
        "expect one of the following forms: 'table:<TABLE_NAME>', 'all_tables', 'cron:<CRON_EXPRESSION>', "
        "'every:<DURATION>', or 'request:<PATH>'"
    )


def validate_db_name(name: str) -> None:
    """H ``validate_db_name``: 400 ``{"error": ...}`` (``ValidateDbNameError``)."""
    why = None
    if not name:
        why = "db name cannot be empty"
    elif len(name) > 511:
        why = "db name too long: max 511"
    elif not (name[0].isascii() and name[0].isalnum()):
        why = "db name did not start with a number or letter"
    elif name.count("/") > 1 or name.endswith("/"):
        why = (
            "db name with invalid retention policy, if providing a retention policy name, must be of form "
            "'<db_name>/<rp_name>'"
        )
    elif not all((c.isascii() and c.isalnum()) or c in "_-/" for c in name):
        why = (
            "invalid character in database or rp name: must be ASCII, containing only letters, numbers, "
            "underscores, or hyphens"
        )
    if why:
        raise Refused(400, {"error": why})


def _iox(kind: str) -> str:
    """``InfluxColumnType``'s display (``core/schema/src/lib.rs``) of a tag or a line-protocol field type."""
    return (
        "iox::column_type::tag" if kind == "tag" else f"iox::column_type::field::{kind.replace('unsigned', 'uinteger')}"
    )


def guess_precision(ts: int) -> int:
    """``Precision::guess_precision``: the multiplier for a timestamp of unknown unit."""
    val = abs(ts) // 10**9
    return 10**9 if val < 5 else 10**6 if val < 5_000 else 1000 if val < 5_000_000 else 1


def _now_ms() -> int:
    return time.time_ns() // 10**6


def _rfc3339(ms: int) -> str:
    """chrono's ``DateTime<Utc>`` as serde writes it: ``2025-04-18T14:02:45.331Z``."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _arrow_ms(ms: int) -> str:
    """A ``Timestamp(Millisecond, None)`` as arrow's JSON writer prints it: ``2025-04-18T14:02:45.331``."""
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None).isoformat(timespec="milliseconds")


class _Handler(BaseHTTPRequestHandler):
    """Every method goes to :meth:`FakeInfluxV3._serve` (HTTP/1.1, keep-alive, quiet)."""

    fake: FakeInfluxV3
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.fake._serve(self)

    do_POST = do_PUT = do_DELETE = do_OPTIONS = do_GET


class FakeInfluxV3:
    """The server: databases of tables (held by a :class:`support.engine_v3.Engine`), tokens, plugins, triggers."""

    def __init__(
        self,
        *,
        edition: str = "core",
        token: str = "apiv3_admin-token",
        disable_authz: tuple[str, ...] = (),
        without_auth: bool = False,
        max_request_bytes: int = 10 * MIB,
        query_file_limit: int = 432,
        port: int = 0,
    ) -> None:
        if edition not in DB_LIMIT:
            raise ValueError(f"edition {edition!r}: core or enterprise")
        self.edition = edition
        #: token name -> its catalog entry (the hash, never the string): the operator token ``_admin`` first
        self.tokens: dict[str, authz.Token] = {authz.ADMIN_NAME: authz.admin_token(0, token, _now_ms())}
        self._next_db_id = 1
        self.open_paths = {
            p for r in disable_authz for p in {"health": ("/health", "/api/v1/health")}.get(r, (f"/{r}",))
        }
        self.without_auth = without_auth
        self.max_request_bytes = max_request_bytes
        self.query_file_limit = query_file_limit
        self.databases: dict[str, Database] = {}
        self.engine = Engine()
        self.engine.plugin_writes = self._plugin_write
        #: --plugin-dir: files uploaded with POST /api/v3/plugins/files land here, as on the server
        self.plugin_dir = Path(tempfile.mkdtemp(prefix="influxdb3-plugins-"))
        self.triggers: dict[str, Trigger] = {}
        self.files: dict[tuple[str, str], list[int]] = {}  # (db, table) -> gen1 block start of each Parquet file
        self._unpersisted: set[tuple[str, str, int]] = set()
        #: (method, path) of every request, in order: what a client asked for (a re-run setup: nothing mutating)
        self.requests: list[tuple[str, str]] = []
        self.cluster_uuid = str(uuid.uuid4())
        self.process_id = str(uuid.uuid4())
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> FakeInfluxV3:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self.plugin_dir, ignore_errors=True)

    def plugin(self, filename: str) -> ModuleType:
        """A plugin file of the plugin directory, loaded as the engine loads it (``support.engine_v3``)."""
        return load_plugin(self._plugin_path(filename))

    def run_trigger(self, name: str, call_time_ns: int) -> None:
        """What the engine does at a tick of a ``cron:``/``every:`` trigger: its plugin's ``process_scheduled_call``
        with the trigger's arguments, its writes through the write buffer (the schedule itself is not run)."""
        t = self.triggers[name]
        if not t.specification.startswith(("cron:", "every:")):
            raise ValueError(f"trigger {name} is {t.specification}, not a schedule")
        self.engine.run_schedule(self.plugin(t.plugin_filename), t.db, call_time_ns, dict(t.arguments or {}))

    def _plugin_path(self, filename: str) -> Path:
        """``validate_path_within_plugin_dir``: a path that leaves the plugin directory is refused (500)."""
        path = (self.plugin_dir / filename).resolve()
        if not path.is_relative_to(self.plugin_dir.resolve()):
            raise Refused(500, f"Processing engine error: plugin error: path escapes the plugin directory: {filename}")
        return path

    def add_resource_token(self, token: str, permissions: list[dict[str, Any]], name: str | None = None) -> None:
        """An Enterprise resource token with this string, as the token route makes one (Core has only admin
        tokens); :class:`support.authz_v3.CannotParsePermission` for permissions the catalog refuses."""
        if self.edition == "core":
            raise ValueError("InfluxDB 3 Core has only admin tokens; resource tokens are Enterprise only")
        with self._lock:
            self._add_token(name or f"token {len(self.tokens)}", token, permissions, None)

    def _add_token(self, name: str, token: str, specs: list[dict[str, Any]], expiry_secs: int | None) -> authz.Token:
        """C ``create_token_with_permission``, under the lock: the permissions checked
        (:class:`support.authz_v3.CannotParsePermission`), then the name (409), then the token kept."""
        grants, text = authz.grants_from_specs(specs, self._db_id)
        if name in self.tokens:
            raise Refused(409, f"token name already exists, {name}")  # H Error::Catalog(TokenNameAlreadyExists)
        now = _now_ms()
        expiry = None if expiry_secs is None else now + expiry_secs * 1000
        entry = authz.Token(max(t.id for t in self.tokens.values()) + 1, name, authz.token_hash(token), now, expiry, grants, text)  # fmt: skip
        self.tokens[name] = entry
        return entry

    def _db_id(self, name: str) -> int | None:
        """The id of a database that exists (``_internal`` is 0), else None (C ``db_name_to_id``)."""
        if name == "_internal":
            return authz.INTERNAL_DB_ID
        db = self.databases.get(name)
        return None if db is None or db.deleted else db.id

    def _new_database(self, retention_s: int | None = None) -> Database:
        db = Database(retention_s, self._next_db_id)
        self._next_db_id += 1
        return db

    def snapshot(self) -> int:
        """Persist what was written since the last snapshot: one Parquet file per table per block; files written."""
        with self._lock:
            for db, table, block in sorted(self._unpersisted):
                self.files.setdefault((db, table), []).append(block)
            n, self._unpersisted = len(self._unpersisted), set()
        return n

    def file_count(self, db: str, table: str, start_ns: int | None = None, stop_ns: int | None = None) -> int:
        """Parquet files of a table a query over ``[start, stop)`` reads (all of them without a range)."""
        lo = -(2**63) if start_ns is None else start_ns
        hi = 2**63 if stop_ns is None else stop_ns
        return sum(1 for b in self.files.get((db, table), []) if b < hi and b + GEN1_BLOCK_NS > lo)

    # -- HTTP ------------------------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        u = urllib.parse.urlsplit(h.path)
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        with self._lock:
            self.requests.append((h.command, u.path))
        try:
            answer = self._route(h.command, u.path, u.query, h.headers, raw)
        except Refused as e:
            answer = e.answer
        answer.headers.setdefault("cluster-uuid", self.cluster_uuid)
        if answer.body is None:
            payload = b""
        elif isinstance(answer.body, str):
            payload = answer.body.encode()
        else:
            payload = json.dumps(answer.body).encode()
        h.send_response(answer.status)
        for k, v in answer.headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    def _route(self, method: str, path: str, query: str, headers: Any, raw: bytes) -> Answer:
        if method == "OPTIONS":  # CORS preflight, before the token
            return Answer(204, None, {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "*"})
        params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        token = None
        if not (self.without_auth or path in self.open_paths):
            token = self._authenticate(path, params, headers)
        admin, health = authz.Request.admin(), authz.Request.system("health")
        text_ok = Answer(200, "OK", {"Content-Type": "text/plain; charset=utf-8"})
        #: (method, path) -> (what the token must be allowed, None where the handler asks it, the handler)
        routes: dict[tuple[str, str], tuple[authz.Request | None, Callable[[], Answer]]] = {
            ("POST", "/write"): (None, lambda: self._legacy_write(token, query, params, headers, raw, v2=False)),
            ("POST", "/api/v2/write"): (None, lambda: self._legacy_write(token, query, params, headers, raw, v2=True)),
            ("POST", "/api/v3/write_lp"): (None, lambda: self._write_lp(token, query, params, headers, raw)),
            ("GET", "/query"): (None, lambda: self._influxql(token, params)),
            ("POST", "/query"): (None, lambda: self._influxql(token, {**params, **self._form(headers, raw)})),
            ("GET", "/health"): (health, lambda: text_ok),
            ("GET", "/api/v1/health"): (health, lambda: text_ok),
            ("GET", "/ping"): (authz.Request.system("ping"), self._ping),
            ("POST", "/ping"): (authz.Request.system("ping"), self._ping),
            ("GET", "/api/v3/configure/database"): (admin, lambda: self._show_databases(params)),
            ("POST", "/api/v3/configure/database"): (admin, lambda: self._create_database(headers, raw)),
            ("PUT", "/api/v3/configure/database"): (admin, lambda: self._update_database(headers, raw)),
            ("DELETE", "/api/v3/configure/database"): (admin, lambda: self._delete_database(params)),
            ("POST", "/api/v3/plugins/files"): (admin, lambda: self._plugin_file(headers, raw, create=True)),  # H authorize_admin
            ("PUT", "/api/v3/plugins/files"): (admin, lambda: self._plugin_file(headers, raw, create=False)),
            ("POST", "/api/v3/configure/processing_engine_trigger"): (admin, lambda: self._create_trigger(query, headers, raw)),
            ("DELETE", "/api/v3/configure/processing_engine_trigger"): (admin, lambda: self._delete_trigger(params)),
            ("GET", "/api/v3/query_sql"): (None, lambda: self._query_sql(token, params)),
            ("DELETE", "/api/v3/configure/token"): (admin, lambda: self._delete_token(params)),  # H delete_token
        }  # fmt: skip
        if self.edition == "enterprise":  # the route Core does not have: 404 there, after the token
            routes[("POST", "/api/v3/enterprise/configure/token")] = (admin, lambda: self._create_token(headers, raw))
        found = routes.get((method, path))
        if found is None and method in ("GET", "POST") and path.startswith("/api/v3/engine/"):
            self._allow(token, admin)
            return self._request_trigger(path.removeprefix("/api/v3/engine/"), params, headers, raw)
        if found is None:
            return Answer(404, "Not found")
        need, handler = found
        if need is not None:
            self._allow(token, need)
        return handler()

    @staticmethod
    def _may(token: authz.Token | None, request: authz.Request) -> bool:
        return token is None or token.allows(request)

    @staticmethod
    def _allow(token: authz.Token | None, request: authz.Request) -> None:
        """The authorizer (:mod:`support.authz_v3`); a refusal is 403 with an empty body (H
        ``Error::ResourceAuthorization``). No token: the server was started without auth, or not for this path."""
        if token is not None and not token.allows(request):
            raise Refused(403, None)

    def _authenticate(self, path: str, params: dict[str, str], headers: Any) -> authz.Token:
        """H ``authenticate_request``: the token's catalog entry, or :class:`Refused` 401/400; an expired
        token is refused as an unknown one (``AuthenticatorError::ExpiredToken``, mapped to ``Unauthenticated``)."""
        token = params.get("p") if path in ("/query", "/write") else None
        header = headers.get("Authorization")
        if token is None and header is not None:
            parts = header.split(" ")
            if len(parts) != 2 or parts[0] not in ("Bearer", "Token", "Basic"):
                raise Refused(400, MALFORMED_AUTH)
            token = parts[1]
            if parts[0] == "Basic":
                try:
                    user, sep, token = base64.b64decode(parts[1], validate=True).decode().rpartition(":")
                except (binascii.Error, UnicodeDecodeError):
                    raise Refused(400, MALFORMED_AUTH) from None
                if not sep or ":" in user:
                    raise Refused(400, MALFORMED_AUTH)
        if token is None:
            raise Refused(401, UNAUTHENTICATED)
        digest = authz.token_hash(token)
        with self._lock:
            found = next((t for t in self.tokens.values() if t.hash == digest), None)
        if found is None or found.expired(_now_ms()):
            raise Refused(401, UNAUTHENTICATED)
        return found

    def _ping(self) -> Answer:
        body = {"product_name": f"InfluxDB 3 {self.edition.title()}", "version": VERSION, "revision": "d783411"}
        body["process_id"] = self.process_id
        headers = {"Content-Type": "application/json", "X-Influxdb-Build": self.edition.title()}
        return Answer(200, body, {**headers, "X-Influxdb-Version": VERSION, "Request-Id": str(uuid.uuid4())})

    @staticmethod
    def _form(headers: Any, raw: bytes) -> dict[str, str]:
        if "application/x-www-form-urlencoded" in (headers.get("Content-Type") or ""):
            return dict(urllib.parse.parse_qsl(raw.decode("utf-8", "replace")))
        return {}

    # -- writes ----------------------------------------------------------------------------------
    def _legacy_write(
        self, token: authz.Token | None, query: str, params: dict[str, str], headers: Any, raw: bytes, *, v2: bool
    ) -> Answer:
        """``core/iox_http/src/write/{v1,v2}.rs`` and ``single_tenant/mod.rs``: the database, then the write."""
        what = "org/bucket/precision" if v2 else "db/rp/precision"

        def refuse(why: str) -> Refused:
            return Refused(400, {"code": "invalid", "message": why} if v2 else {"error": why})

        if not query:
            raise refuse("no org/bucket destination provided" if v2 else "no db destination provided")
        precision = LEGACY_PRECISION.get(params.get("precision") or "ns")
        if precision is None:
            raise refuse(f"failed to deserialize {what} in request: unknown variant `{params['precision']}`")
        if v2:
            if not params.get("bucket"):
                raise refuse("missing bucket value")
            db = params["bucket"]
        else:
            if "db" not in params:
                raise refuse(f"failed to deserialize {what} in request: missing field `db`")
            rp = params.get("rp") or ""
            db = params["db"] if rp in ("", "autogen", "default") else f"{params['db']}/{rp}"
        try:
            return self._write(token, db, precision, False, headers, raw)
        except Refused as e:
            if not v2 or e.answer.status in (401, 403):
                raise
            body = e.answer.body
            why = body.get("error") if isinstance(body, dict) else body
            if isinstance(body, dict) and body.get("error") == "line protocol parsing error":
                why = f"write buffer error: line protocol parse failed: {body['data']['error_message']}"
            elif isinstance(body, dict) and e.answer.status == 422:
                why = f"write buffer error: catalog update error: {why}"
            code = {413: "request too large"}.get(e.answer.status, "invalid")
            raise Refused(413 if code == "request too large" else 400, {"code": code, "message": why}) from None

    def _write_lp(
        self, token: authz.Token | None, query: str, params: dict[str, str], headers: Any, raw: bytes
    ) -> Answer:
        if not query:
            raise Refused(400, "missing query parameter 'db'")
        if "db" not in params:
            raise Refused(400, "serde error: missing field `db`")
        precision = V3_PRECISION.get(params.get("precision") or "auto")
        if precision is None:
            raise Refused(400, f"serde error: unknown variant `{params['precision']}`")
        accept_partial = (params.get("accept_partial") or "true") == "true"
        return self._write(token, params["db"], precision, accept_partial, headers, raw)

    def _write(
        self, token: authz.Token | None, db: str, precision: int, accept_partial: bool, headers: Any, raw: bytes
    ) -> Answer:
        """H ``write_lp_inner``: the name, the body, then V's line-by-line validation; 204 or an error."""
        validate_db_name(db)
        with self._lock:
            self._allow(token, authz.Request.database(self._db_id(db), authz.WRITE))
        body = self._read_body(headers, raw)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Refused(400, f"body content is not valid utf8: {e}") from None
        errors = self._store(db, text, precision, accept_partial)
        if errors:
            status = 422 if any(e.limit for e in errors) else 400
            body = {"error": "partial write of line protocol occurred", "data": [e.json() for e in errors]}
            raise Refused(status, body)
        return Answer(204)

    def _store(self, db: str, text: str, precision: int, accept_partial: bool) -> list[LineError]:
        """The write buffer's ``write_lp``: create the database, validate, keep the good lines; the bad ones."""
        with self._lock:
            database = self.databases.get(db)
            if database is None:
                if sum(1 for d in self.databases.values() if not d.deleted) >= DB_LIMIT[self.edition]:
                    limit = DB_LIMIT[self.edition]
                    raise Refused(422, {"error": f"Adding a new database would exceed limit of {limit} databases"})
                database = self._new_database()
            elif database.deleted:
                why = f"cannot write to soft-deleted database '{db}' - it is marked for deletion"
                raise Refused(400, {"error": why})
            good, errors = self._validate(database, text, precision, accept_partial)
            self.databases[db] = database
            if good:
                self.engine.write(db, "".join(good))
                for line in good:
                    p = parse_points(line.encode(), "ns", 0)[0][0]
                    self._unpersisted.add((db, p.measurement, p.time_ns // GEN1_BLOCK_NS * GEN1_BLOCK_NS))
        return errors

    def _plugin_write(self, db: str, text: str) -> None:
        """A plugin call's buffered lines, through the write buffer (the engine's ``WriteEndpoint``)."""
        errors = self._store(db, text, 1, True)
        if errors:
            raise AssertionError(f"the plugin wrote lines the server refuses: {[e.json() for e in errors]}")

    def _validate(
        self, database: Database, text: str, precision: int, accept_partial: bool
    ) -> tuple[list[str], list[LineError]]:
        """V ``v1_parse_lines_and_catalog_updates``: the good lines (as ns line protocol) and the errors;
        without partial writes the first error refuses the batch and nothing changes."""
        columns = {t: dict(c) for t, c in database.columns.items()}  # the transaction's copy
        good, errors = [], []
        lines = [ln for ln in text.split("\n") if ln.strip() and not ln.lstrip().startswith("#")]
        now = time.time_ns()
        for number, line in enumerate(lines, start=1):
            error = self._check_line(columns, line.strip(), precision, now)
            if isinstance(error, str):
                good.append(error)
                continue
            err = LineError(line, number, error[0], error[1])
            if not accept_partial:
                raise Refused(400, {"error": "line protocol parsing error", "data": err.json()})
            errors.append(err)
        database.columns = columns
        return good, errors

    def _check_line(
        self, columns: dict[str, dict[str, str]], line: str, precision: int, now: int
    ) -> str | tuple[str, bool]:
        """One line: its line protocol with a nanosecond timestamp, or (why, is a limit)."""
        points, failed = parse_points(line.encode(), "ns", now)
        if failed:
            return failed[0].split("': ", 1)[-1], False
        p = points[0]
        table = columns.setdefault(p.measurement, {})
        new = [(k, "tag") for k, _ in p.tags] + [(f, kind) for f, (kind, _) in p.fields.items()]
        for name, kind in new:
            have = table.get(name)
            if have is None:
                if len(table) >= COLUMN_LIMIT:
                    return (
                        f"Update to schema would exceed number of columns per table limit of {COLUMN_LIMIT} columns",
                        True,
                    )
                table[name] = kind
            elif have != kind:
                return f"invalid column type for column '{name}', expected {_iox(have)}, got {_iox(kind)}", False
        if p.time_ns == now:  # no timestamp: the time of the write
            return f"{line} {now}\n"
        return f"{line.rsplit(' ', 1)[0]} {p.time_ns * (precision or guess_precision(p.time_ns))}\n"

    def _read_body(self, headers: Any, raw: bytes) -> bytes:
        """H ``read_body``: the size limit before and after gzip."""
        encoding = headers.get("Content-Encoding")
        too_large = Refused(413, f"max request size ({self.max_request_bytes} bytes) exceeded")
        if encoding not in (None, "identity", "gzip"):
            raise Refused(400, f"unacceptable content-encoding: {encoding}")
        if len(raw) > self.max_request_bytes:
            raise too_large
        if encoding != "gzip":
            return raw
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            data = d.decompress(raw, self.max_request_bytes + 1)
        except zlib.error as e:
            raise Refused(400, f"error decoding gzip stream: {e}") from None
        if len(data) > self.max_request_bytes:
            raise too_large
        return data

    # -- databases -------------------------------------------------------------------------------
    @staticmethod
    def _json_body(headers: Any, raw: bytes) -> dict[str, Any]:
        """H ``read_body_json``: ``application/json`` only (415), then serde (400)."""
        ctype = (headers.get("Content-Type") or "").split(";")[0].strip()
        if not (ctype.startswith("application/") and (ctype.endswith("/json") or ctype.endswith("+json"))):
            raise Refused(415, "unacceptable content-type, expected: application/json")
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise Refused(400, f"serde json error: {e}") from None
        if not isinstance(body, dict):
            raise Refused(400, "serde json error: expected an object")
        return body

    @staticmethod
    def _required(body: dict[str, Any], *names: str) -> None:
        for n in names:
            if n not in body:
                raise Refused(400, f"serde json error: missing field `{n}`")

    @staticmethod
    def _retention(value: Any) -> int | None:
        if value is None:
            return None
        try:
            return int(humantime_seconds(str(value)))
        except ValueError:
            raise Refused(400, f"serde json error: invalid duration {value!r}") from None

    def _create_database(self, headers: Any, raw: bytes) -> Answer:
        body = self._json_body(headers, raw)
        self._required(body, "db")
        validate_db_name(body["db"])
        retention = self._retention(body.get("retention_period"))
        with self._lock:
            if body["db"] in self.databases:
                raise Refused(409, "attempted to create a resource that already exists")
            if sum(1 for d in self.databases.values() if not d.deleted) >= DB_LIMIT[self.edition]:
                raise Refused(
                    422, {"error": f"Adding a new database would exceed limit of {DB_LIMIT[self.edition]} databases"}
                )
            self.databases[body["db"]] = self._new_database(retention)
        return Answer(200)

    def _update_database(self, headers: Any, raw: bytes) -> Answer:
        body = self._json_body(headers, raw)
        self._required(body, "db")
        retention = self._retention(body.get("retention_period"))
        with self._lock:
            self._active(body["db"]).retention_period_s = retention
        return Answer(200)

    def _active(self, name: str) -> Database:
        """A database that exists and is not deleted, or 404 (``CatalogError::DatabaseNotFound``)."""
        db = self.databases.get(name)
        if db is None or db.deleted:
            raise Refused(404, f"Database not found {name}")
        return db

    def _show_databases(self, params: dict[str, str]) -> Answer:
        if "format" not in params:
            raise Refused(400, "serde error: missing field `format`")
        if params["format"] != "json":
            raise Refused(400, f"this stand-in answers format=json only, not {params['format']!r}")
        with self._lock:
            names = sorted(n for n, d in self.databases.items() if not d.deleted)
        return Answer(200, [{"iox::database": n} for n in names], {"Content-Type": "application/json"})

    def _delete_database(self, params: dict[str, str]) -> Answer:
        if "db" not in params:
            raise Refused(400, "serde error: missing field `db`")
        with self._lock:
            self._active(params["db"]).deleted = True
        return Answer(200)

    # -- plugins and triggers ------------------------------------------------------------------
    def _plugin_file(self, headers: Any, raw: bytes, *, create: bool) -> Answer:
        body = self._json_body(headers, raw)
        self._required(body, "plugin_name", "content")
        with self._lock:
            if create:
                path = self._plugin_path(body["plugin_name"])
            else:
                trigger = self.triggers.get(body["plugin_name"])
                if trigger is None:
                    raise Refused(
                        500, f"Processing engine error: plugin error: Plugin not found: {body['plugin_name']}"
                    )
                path = self._plugin_path(trigger.plugin_filename)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body["content"], encoding="utf-8")
        return Answer(200)

    def _create_trigger(self, query: str, headers: Any, raw: bytes) -> Answer:
        body = dict(urllib.parse.parse_qsl(query)) if query else self._json_body(headers, raw)
        self._required(
            body, "db", "plugin_filename", "trigger_name", "trigger_settings", "trigger_specification", "disabled"
        )
        settings = body["trigger_settings"]  # influxdb3_catalog/src/log/versions/v4.rs TriggerSettings: both required
        if not isinstance(settings, dict):
            raise Refused(400, "serde json error: trigger_settings: expected an object")
        self._required(settings, "run_async", "error_behavior")
        if settings["error_behavior"] not in ("log", "retry", "disable"):
            raise Refused(400, f"serde json error: unknown variant `{settings['error_behavior']}`")
        with self._lock:
            if not self._plugin_path(body["plugin_filename"]).is_file():
                raise Refused(
                    500, f"Plugin error: reading plugin file: No such file or directory: {body['plugin_filename']}"
                )
            parse_trigger_spec(body["trigger_specification"])
            self._active(body["db"])
            if any(t.db == body["db"] and t.name == body["trigger_name"] for t in self.triggers.values()):
                raise Refused(409, "attempted to create a resource that already exists")
            self.triggers[body["trigger_name"]] = Trigger(
                body["db"],
                body["trigger_name"],
                body["plugin_filename"],
                body["trigger_specification"],
                body.get("trigger_arguments"),
                body["trigger_settings"],
                bool(body["disabled"]),
            )
        return Answer(200)

    def _delete_trigger(self, params: dict[str, str]) -> Answer:
        self._required(params, "db", "trigger_name")
        with self._lock:
            t = self.triggers.get(params["trigger_name"])
            if t is None or t.db != params["db"]:
                raise Refused(404, f"Processing engine trigger not found: {params['trigger_name']}")
            del self.triggers[t.name]
        return Answer(200)

    # -- tokens ----------------------------------------------------------------------------------
    def _create_token(self, headers: Any, raw: bytes) -> Answer:
        """``POST /api/v3/enterprise/configure/token`` (Enterprise: docs ``admin/tokens/resource/create``): the
        body's permissions name ``resource_names`` (``resource_identifier`` is refused by serde: docs-v2#7063);
        C ``create_token_with_permission``: the permissions checked, then the name (409, ``ops/token.rs``
        ``CreateResourceScopedTokenOp``); 201 with ``CreateTokenWithPermissionsResponse``
        (``influxdb3_types/src/http.rs``), the only time the token string is shown."""
        body = self._json_body(headers, raw)
        self._required(body, "token_name", "permissions")
        if not isinstance(body["permissions"], list) or not all(isinstance(p, dict) for p in body["permissions"]):
            raise Refused(400, "serde json error: permissions: expected a sequence of objects")
        for spec in body["permissions"]:
            self._required(spec, "resource_type", "resource_names", "actions")
        secs = body.get("expiry_secs")
        if secs is not None and (not isinstance(secs, int) or isinstance(secs, bool) or secs < 0):
            raise Refused(400, f"serde json error: expiry_secs: invalid value {secs!r}, expected u64")
        name = str(body["token_name"])
        token = authz.new_token_string()
        with self._lock:
            try:
                entry = self._add_token(name, token, body["permissions"], secs)
            except authz.CannotParsePermission as e:
                raise Refused(500, str(e)) from None  # CatalogError into_response: the rest are 500
        expiry = entry.expiry_ms
        answer = {"id": entry.id, "name": name, "token": token, "hash": entry.hash.hex(),
                  "created_at": _rfc3339(entry.created_at_ms),
                  "expiry": None if expiry is None else _rfc3339(expiry)}  # fmt: skip
        return Answer(201, answer, {"Content-Type": "json"})  # sic, as H create_named_admin_token

    def _delete_token(self, params: dict[str, str]) -> Answer:
        """H ``delete_token`` (C ``delete_token``): 405 for the operator token, 404 for a name that is not there."""
        self._required(params, "token_name")
        name = params["token_name"]
        with self._lock:
            if name == authz.ADMIN_NAME:
                raise Refused(405, "cannot delete operator token")
            if name not in self.tokens:
                raise Refused(404, f"the requested resource was not found: {name}")
            del self.tokens[name]
        return Answer(200)

    def _token_row(self, t: authz.Token) -> dict[str, Any]:
        """A row of ``system.tokens`` (``influxdb3_system_tables/src/tokens.rs``): the hash's first 9 hex digits
        (only when started with auth), times as arrow's JSON writes a timestamp without zone; the
        permissions as given (the public source prints Core's ``*:*:*`` only, so the text is approximated)."""
        row: dict[str, Any] = {"token_id": t.id, "name": t.name}
        if not self.without_auth:
            row["hash"] = t.hash.hex()[:9]
        row["created_at"] = _arrow_ms(t.created_at_ms)
        row["expiry"] = None if t.expiry_ms is None else _arrow_ms(t.expiry_ms)
        row["permissions"] = t.text
        return row

    def _query_sql(self, token: authz.Token | None, params: dict[str, str]) -> Answer:
        """H ``query_sql``: the system tables setup and doctor read, else SQL on the database's tables; the
        token must read the database (``_internal``: an admin token)."""
        self._required(params, "db", "q")
        db, q = params["db"], params["q"]
        m = re.fullmatch(r"\s*SELECT\s+\*\s+FROM\s+system\.(\w+)\s*;?\s*", q, re.IGNORECASE)
        with self._lock:
            self._allow(token, authz.Request.database(self._db_id(db), authz.READ))
            if db != "_internal":
                self._active(db)
            if m is None:
                try:
                    rows = self.engine.sql(db, q).to_pylist()
                except QueryError as e:
                    raise Refused(400, {"error": str(e)}) from None
            else:
                rows = self._system_table(db, m[1])
        rows = [{k: v for k, v in r.items() if v is not None} for r in rows]
        return Answer(200, rows, {"Content-Type": "application/json"})

    def _system_table(self, db: str, table: str) -> list[dict[str, Any]]:
        internal = {"databases", "plugin_files", "tokens"}
        per_database = {"processing_engine_triggers", "processing_engine_trigger_arguments"}
        if (table in internal and db != "_internal") or table not in internal | per_database:
            raise Refused(400, {"error": f"Error during planning: table 'public.system.{table}' not found"})
        triggers = [t for t in self.triggers.values() if t.db == db]
        if table == "tokens":
            return [self._token_row(t) for t in sorted(self.tokens.values(), key=lambda t: t.id)]
        if table == "databases":
            return [
                {"database_name": n, "retention_period_ns": None if d.retention_period_s is None else d.retention_period_s * 10**9,
                 "deleted": d.deleted}
                for n, d in sorted(self.databases.items())
            ]  # fmt: skip
        if table == "plugin_files":
            out = []
            for t in self.triggers.values():
                path = self._plugin_path(t.plugin_filename)
                if path.is_file():
                    st = path.stat()
                    out.append({"plugin_name": t.name, "file_name": t.plugin_filename, "file_path": str(path),
                                "size_bytes": st.st_size, "last_modified": int(st.st_mtime * 1000)})  # fmt: skip
            return out
        if table == "processing_engine_triggers":
            return [
                {"trigger_name": t.name, "plugin_filename": t.plugin_filename, "trigger_specification": t.specification,
                 "disabled": t.disabled, "error_behavior": t.settings["error_behavior"]}
                for t in triggers
            ]  # fmt: skip
        return [
            {"trigger_name": t.name, "argument_key": k, "argument_value": v}
            for t in triggers
            for k, v in sorted((t.arguments or {}).items())
        ]

    def _request_trigger(self, trigger_path: str, params: dict[str, str], headers: Any, raw: bytes) -> Answer:
        """H ``processing_engine_request_plugin``: the ``request:<path>`` trigger's plugin answers, Flask-style
        (``system_py.rs`` ``process_flask_response``); none -> 404 ``{error: "not found"}`` (sic)."""
        with self._lock:
            found = [
                t for t in self.triggers.values() if t.specification == f"request:{trigger_path}" and not t.disabled
            ]
        if not found:
            return Answer(404, '{error: "not found"}')
        t = found[0]
        body = self._read_body(headers, raw)
        plugin = self.plugin(t.plugin_filename)
        plain = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        try:
            status, answer = self.engine.run_request(plugin, t.db, params, dict(t.arguments or {}), body, plain)
        except Exception as e:  # the plugin raised: plugins.rs answers 500 {"error": ...}
            return Answer(500, {"error": str(e)})
        return Answer(
            status, answer, {"Content-Type": "application/json" if isinstance(answer, dict | list) else "text/html"}
        )

    # -- InfluxQL ------------------------------------------------------------------------------
    def _influxql(self, token: authz.Token | None, params: dict[str, str]) -> Answer:
        q = params.get("q")
        if not q:
            raise Refused(400, {"error": "missing query parameter 'q'"})
        try:
            result = self._statement(token, q, params.get("db") or None)
        except Refused as e:
            if e.answer.status == 401:  # refused by the authorizer: an HTTP error, not an in-band one
                raise
            result = {"error": e.answer.body}
        except QueryError as e:
            result = {"error": str(e)}
        return Answer(200, {"results": [{"statement_id": 0, **result}]}, {"Content-Type": "application/json"})

    def _statement(self, token: authz.Token | None, q: str, request_db: str | None) -> dict[str, Any]:
        """One statement of :mod:`support.influxql_v3`'s subset, planned onto DataFusion SQL, after the
        authorizer (``core/iox_v1_query_api/src/handler.rs``): ``SHOW DATABASES`` lists the databases the token
        may ``describe``, any other statement needs ``read`` on its database; a token allowed none is 401
        ``unauthorized access`` (``AuthorizationFailure``, H ``IntoResponse for HttpError``)."""
        try:
            st = influxql.parse(q)
        except influxql.Unsupported as e:
            raise Refused(400, str(e)) from None
        if isinstance(st, influxql.ShowDatabases):
            with self._lock:
                names = sorted(n for n, d in self.databases.items() if not d.deleted)
                allowed = [n for n in names if self._may(token, authz.Request.database(self._db_id(n), authz.DESCRIBE))]
            if names and not allowed:
                raise Refused(401, UNAUTHORIZED_QUERY)
            names = allowed
            return {"series": [{"name": "databases", "columns": ["name"], "values": [[n] for n in names]}]}
        db = st.source.database or request_db
        if db is None:
            raise Refused(400, "must specify a 'db' parameter, or provide the database in the InfluxQL query")
        measurement = st.source.measurement
        with self._lock:
            if not self._may(token, authz.Request.database(self._db_id(db), authz.READ)):
                raise Refused(401, UNAUTHORIZED_QUERY)
            if db not in self.databases or self.databases[db].deleted:
                raise Refused(400, f"Database {db} not found")  # handler.rs plan_query: Error::DatabaseNotFound
            table = self.engine.databases.get(db, {}).get(measurement)
            if table is None:
                return {}  # a measurement the database does not have: no series
            tags, fields = set(table.tags), list(table.types)
            now = time.time_ns()
            where = st.where
            start = where.start_ns if where.has_time or isinstance(st, influxql.Select) else now - influxql.DAY_NS
            if self.file_count(db, measurement, start, where.stop_ns) > self.query_file_limit:
                raise Refused(500, FILE_LIMIT_ERROR.format(self.query_file_limit))
            if isinstance(st, influxql.ShowTagValues):
                sql = influxql.tag_values_sql(st, tags, fields, now)
                names = ["key", "value"]
            else:
                planned = influxql.select_sql(st, tags, fields)
                sql, names = planned if planned else (None, [])
            if sql is None:
                return {}
            result = self.engine.sql(db, sql)
        rows = result.to_pylist()
        if isinstance(st, influxql.ShowTagValues):
            values = [[st.key, r["value"]] for r in rows]
        else:
            values = [[r[c] for c in names] for r in rows]
        return {"series": [{"name": measurement, "columns": names, "values": values}]} if values else {}


@contextmanager
def running(**kwargs: Any) -> Iterator[FakeInfluxV3]:
    """A started stand-in, stopped afterwards (the tests' fixture)."""
    fake = FakeInfluxV3(**kwargs).start()
    try:
        yield fake
    finally:
        fake.stop()
