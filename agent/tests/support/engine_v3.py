"""A stand-in for InfluxDB 3's processing engine: the ``influxdb3_local`` API over DataFusion, the engine 3.x queries with.

No InfluxDB 3 runs here (no package ships it); Apache DataFusion does (PyPI ``datafusion``, the Python
bindings of the SQL engine InfluxDB 3 plans and runs every query with). So a plugin's SQL runs on the
real engine, over tables built from the points written, and the plugin's own trigger functions run as
the server calls them. It follows ``influxdb3_py_api/src/system_py.rs`` (``influxdata/influxdb``, 3.10
nightly d7834110):

* ``query(query, args=None, database=None)`` (``PyPluginCallApi::query``): SQL only, on the trigger's
  database unless ``database=`` names another; ``args`` are strings bound to ``$name`` parameters
  (``StatementParams``); the answer is a list of dicts, one per row: timestamps as int nanoseconds,
  dictionary (tag) columns as str, null as None; any other Arrow type raises ``ValueError``
  (``Unsupported data type``); a failed query raises :class:`QueryError`;
* ``write(line)`` / ``write_to_db(db, line)`` call ``line.build()`` at once and buffer the text
  (``WriteAccumulator``); the engine writes the buffered lines when the call has returned
  (``PluginReturnState.write_db_lines``): a plugin that raises writes nothing;
* ``info``/``warn``/``error(*args)`` join ``str()`` of the arguments with spaces (``log_args_to_string``);
* ``process_scheduled_call(influxdb3_local, call_time, args)`` gets the tick as a naive local
  ``datetime`` (``PyDateTime::from_timestamp(.., None)``, whole seconds); ``process_request(influxdb3_local,
  query_parameters, request_headers, request_body, args)`` answers Flask-style: a dict is JSON with 200,
  a ``(body, status)`` tuple sets the status (``process_flask_response``);
* ``LineBuilder`` is a builtin of the plugin (``line_builder/mod.rs`` ``setup_line_builder``): the port
  below follows ``line_builder/line_builder.py``.

Storage follows the server where the plugin's results depend on it: a table per measurement, tags as
``Dictionary(Int32, Utf8)`` columns, ``time`` as ``Timestamp(ns)``, fields by their line-protocol type;
a point written again at the same series and time keeps, per column, the last non-null value
(``core/iox_query/src/provider/deduplicate.rs``: "last non-null value"). The session is configured as
IOx configures it where that changes results (:meth:`Engine.context`).

Known differences: the synchronous ``write_sync``/``write_sync_to_db`` and ``cache`` are not modelled (the gpulse plugin does
not use them); a column's type is taken from its first value in the database (the server refuses a
write whose field type conflicts; the plugin never writes one); no file limit (``fake_influx_v3``
models Parquet files).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
from datafusion import SessionConfig, SessionContext

from .influx_points import parse_points

TAG_TYPE = pa.dictionary(pa.int32(), pa.string())
#: line-protocol field type (influx_points) -> Arrow type of the column
FIELD_TYPES = {"float": pa.float64(), "integer": pa.int64(), "unsigned": pa.uint64(), "boolean": pa.bool_()}


class QueryError(Exception):
    """``influxdb3_py_api.QueryError``: ``error: <why> executing query on <db>: <sql>``."""


# -- LineBuilder (influxdb3_py_api/src/line_builder/line_builder.py) ----------------------------------
class InfluxDBError(Exception):
    pass


class InvalidMeasurementError(InfluxDBError):
    pass


class InvalidKeyError(InfluxDBError):
    pass


class InvalidLineError(InfluxDBError):
    pass


class LineBuilder:
    """The builtin ``LineBuilder`` of plugins, ported from ``line_builder.py`` (the methods gpulse uses)."""

    def __init__(self, measurement: str) -> None:
        if " " in measurement:
            raise InvalidMeasurementError("Measurement name cannot contain spaces")
        self.measurement = measurement
        self.tags: dict[str, str] = {}
        self.fields: dict[str, str] = {}
        self._timestamp_ns: int | None = None

    @staticmethod
    def _validate_key(key: str, key_type: str) -> None:
        if not key:
            raise InvalidKeyError(f"{key_type} key cannot be empty")
        for ch, what in ((" ", "spaces"), (",", "commas"), ("=", "equals signs")):
            if ch in key:
                raise InvalidKeyError(f"{key_type} key '{key}' cannot contain {what}")

    @staticmethod
    def _escape(value: str) -> str:
        """``_escape_tag_value`` and ``_escape_field_key`` (the same four replacements)."""
        return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")

    def tag(self, key: str, value: str) -> LineBuilder:
        self._validate_key(key, "tag")
        self.tags[key] = str(value)
        return self

    def int64_field(self, key: str, value: int) -> LineBuilder:
        self._validate_key(key, "field")
        self.fields[key] = f"{value}i"
        return self

    def float64_field(self, key: str, value: float) -> LineBuilder:
        self._validate_key(key, "field")
        self.fields[key] = f"{int(value)}.0" if value % 1 == 0 else str(value)
        return self

    def string_field(self, key: str, value: str) -> LineBuilder:
        self._validate_key(key, "field")
        self.fields[key] = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return self

    def time_ns(self, timestamp_ns: int) -> LineBuilder:
        self._timestamp_ns = timestamp_ns
        return self

    def build(self) -> str:
        line = self.measurement.replace(",", "\\,").replace(" ", "\\ ")
        if self.tags:
            line += "," + ",".join(f"{k}={self._escape(v)}" for k, v in self.tags.items())
        if not self.fields:
            raise InvalidLineError(f"At least one field is required: {line}")
        line += " " + ",".join(f"{self._escape(k)}={v}" for k, v in self.fields.items())
        if self._timestamp_ns is not None:
            line += f" {self._timestamp_ns}"
        return line


# -- the databases ------------------------------------------------------------------------------------
@dataclass
class Table:
    """One measurement: rows by (tags, time), each a dict of non-null field values; column types."""

    rows: dict[tuple[tuple[tuple[str, str], ...], int], dict[str, Any]] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)
    types: dict[str, pa.DataType] = field(default_factory=dict)

    def arrow(self) -> pa.Table:
        keys = sorted(self.rows, key=lambda k: k[1])
        cols: dict[str, pa.Array] = {}
        for t in sorted(self.tags):
            cols[t] = pa.array([dict(k[0]).get(t) for k in keys], TAG_TYPE)
        cols["time"] = pa.array([k[1] for k in keys], pa.timestamp("ns"))
        for f, typ in self.types.items():
            cols[f] = pa.array([self.rows[k].get(f) for k in keys], typ)
        return pa.table(cols)


def _value(kind: str, text: str) -> Any:
    if kind == "float":
        return float(text)
    if kind in ("integer", "unsigned"):
        return int(text.rstrip("iu"))
    if kind == "boolean":
        return text[:1] in "tT"
    return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")


@dataclass
class Engine:
    """Databases of tables, the plugin API over them, and the calls the processing engine makes."""

    databases: dict[str, dict[str, Table]] = field(default_factory=dict)
    logs: list[tuple[str, str]] = field(default_factory=list)  # (level, line) of every plugin call
    #: where a plugin call's buffered lines go (database, text); None: straight into the tables. A server
    #: stand-in sets its own write path here (fake_influx_v3: limits, Parquet files).
    plugin_writes: Callable[[str, str], None] | None = None

    def write(self, database: str, lines: str) -> None:
        """Line protocol into ``database`` (created by its first write), as the write path stores it."""
        points, failed = parse_points(lines.encode(), "ns", 0)
        if failed:
            raise ValueError("\n".join(failed))
        tables = self.databases.setdefault(database, {})
        for p in points:
            table = tables.setdefault(p.measurement, Table())
            table.tags.update(k for k, _ in p.tags)
            row = table.rows.setdefault((p.tags, p.time_ns), {})
            for name, (kind, text) in p.fields.items():
                table.types.setdefault(name, FIELD_TYPES.get(kind, pa.string()))
                row[name] = _value(kind, text)

    def rows(self, database: str, measurement: str) -> list[dict[str, Any]]:
        """Every row of a table: its tags, ``time`` (ns) and non-null fields (what tests compare)."""
        table = self.databases.get(database, {}).get(measurement)
        if table is None:
            return []
        return [{**dict(tags), "time": ts, **fields} for (tags, ts), fields in sorted(table.rows.items())]

    def context(self) -> SessionContext:
        """IOx's session settings that change what a query sees (``core/datafusion_util/src/config.rs``
        ``iox_session_config``): ``information_schema`` on, tables in catalog ``public`` schema ``iox``,
        strings as ``Utf8`` (not ``Utf8View``)."""
        config = (
            SessionConfig()
            .with_information_schema(True)
            .with_create_default_catalog_and_schema(True)
            .with_default_catalog_and_schema("public", "iox")
            .set("datafusion.sql_parser.map_string_types_to_utf8view", "false")
        )
        return SessionContext(config)

    def sql(self, database: str, query: str, args: Mapping[str, str] | None = None) -> pa.Table:
        """Run SQL on one database's tables in DataFusion; a failure is :class:`QueryError` like the server's."""
        ctx = self.context()
        for name, table in self.databases.get(database, {}).items():
            ctx.register_record_batches(name, [table.arrow().to_batches()])
        try:
            return ctx.sql(query, param_values=dict(args or {})).to_arrow_table()
        except Exception as e:  # DataFusion raises plain Exceptions
            raise QueryError(f"error: {e} executing query on {database}: {query}") from None

    def plugin_api(self, database: str) -> PluginAPI:
        return PluginAPI(self, database)

    # -- the calls the engine makes (system_py.rs execute_*_trigger) ------------------------------------
    def run_schedule(self, plugin: ModuleType, database: str, call_time_ns: int, args: dict[str, str]) -> None:
        api = self.plugin_api(database)
        call_time = dt.datetime.fromtimestamp(call_time_ns // 10**9)  # PyDateTime::from_timestamp(ts, None)
        plugin.process_scheduled_call(api, call_time, args)
        api.flush()

    def run_request(
        self,
        plugin: ModuleType,
        database: str,
        params: dict[str, str],
        args: dict[str, str],
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """``(status, body)`` of a request trigger: a bare answer is 200, ``(body, status)`` sets it.
        ``headers`` are the request's without ``Authorization`` (the server strips it)."""
        api = self.plugin_api(database)
        answer = plugin.process_request(api, params, dict(headers or {}), body, args)
        api.flush()
        if isinstance(answer, tuple):
            return (answer[1] if len(answer) > 1 and isinstance(answer[1], int) else 200), answer[0]
        return 200, answer


@dataclass
class PluginAPI:
    """``influxdb3_local``: what a plugin call sees (``PyPluginCallApi``)."""

    engine: Engine
    database: str
    pending: dict[str, list[str]] = field(default_factory=dict)

    def query(self, query: str, args: dict[str, str] | None = None, database: str | None = None) -> list[dict]:
        table = self.engine.sql(database or self.database, query, args)
        for col in table.schema:
            if not any(
                check(col.type)
                for check in (pa.types.is_int64, pa.types.is_uint64, pa.types.is_float64, pa.types.is_string)
                + (pa.types.is_boolean, pa.types.is_timestamp, pa.types.is_dictionary)
            ):
                raise ValueError(f"Unsupported data type: {col.type}")
        cols = {
            c.name: table.column(c.name).cast(pa.int64()) if pa.types.is_timestamp(c.type) else table.column(c.name)
            for c in table.schema
        }
        plain = {name: col.to_pylist() for name, col in cols.items()}  # dictionary values come back as str
        return [{name: plain[name][i] for name in plain} for i in range(table.num_rows)]

    def write(self, line: LineBuilder) -> None:
        self.write_to_db(self.database, line)

    def write_to_db(self, db_name: str, line: LineBuilder) -> None:
        self.pending.setdefault(db_name, []).append(line.build())

    def flush(self) -> None:
        """What the engine does with ``PluginReturnState.write_db_lines`` after the call returned."""
        write = self.engine.plugin_writes or self.engine.write
        for db, lines in self.pending.items():
            write(db, "\n".join(lines) + "\n")
        self.pending.clear()

    def _log(self, level: str, args: tuple[Any, ...]) -> None:
        self.engine.logs.append((level, " ".join(str(a) for a in args)))

    def info(self, *args: Any) -> None:
        self._log("INFO", args)

    def warn(self, *args: Any) -> None:
        self._log("WARN", args)

    def error(self, *args: Any) -> None:
        self._log("ERROR", args)


def load_plugin(path: Path) -> ModuleType:
    """Import a plugin file with ``LineBuilder`` in its namespace, as the engine makes it a builtin."""
    spec = importlib.util.spec_from_file_location(f"plugin_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.LineBuilder = LineBuilder  # type: ignore[attr-defined]
    spec.loader.exec_module(module)
    return module
