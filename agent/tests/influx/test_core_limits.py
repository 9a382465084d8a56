"""gpulse's tables fit InfluxDB 3 Core's catalog, and ``--api v3`` looks for the server where it listens.

Core holds at most 5 databases, 2,000 tables and 500 columns per table (``influxdata/influxdb``
``influxdb3/src/commands/serve.rs`` ``CORE_NUM_DBS_LIMIT``, ``CORE_NUM_TABLES_LIMIT``,
``CORE_NUM_COLUMNS_PER_TABLE_LIMIT``), and listens on 8181 (``DEFAULT_HTTP_BIND_ADDR``). What a table
holds is read from the schema and the downsampling plugin's generator, the sources of what gpulse writes.
"""

from __future__ import annotations

from support.fake_influx_v3 import COLUMN_LIMIT as CORE_COLUMNS
from support.fake_influx_v3 import DB_LIMIT

from gpulse.agent.connection_config import resolve_connection
from gpulse.influx import engine_plugin
from gpulse.influx.tiers import TIERS
from gpulse.schema import MEASUREMENTS

CORE_DATABASES = DB_LIMIT["core"]
#: the stand-in does not model the table limit
CORE_TABLES = 2000


def _columns(tier: str) -> dict[str, int]:
    """measurement -> its table's columns in the tier's database: time, tags (extra ones at their cap), fields."""
    out = {}
    for name, m in MEASUREMENTS.items():
        tags = len(m.tags) + len(m.optional_tags) + m.max_extra_tags
        if tier == "raw":
            out[name] = 1 + tags + len(m.fields)
        elif m.downsampled:
            fields = {
                dst for _, _, dst in engine_plugin.aggregates(next(t for t in TIERS if t.name == tier)).get(name, [])
            }
            out[name] = 1 + tags + len(fields)
    return out


def test_every_table_of_every_tier_database_fits_cores_column_limit():
    """Open fields (logged scalars, custom phases) add a column per new name on top of these; a line
    that would pass the limit is refused alone and dead-lettered (tests/sinks/test_sink_v3.py)."""
    for tier in ("raw", *(t.name for t in TIERS)):
        columns = _columns(tier)
        assert columns, tier
        widest = max(columns, key=columns.__getitem__)
        assert columns[widest] <= CORE_COLUMNS, f"{tier}: {widest} has {columns[widest]} columns"


def test_gpulse_uses_three_of_cores_five_databases_and_a_few_of_its_tables():
    databases = {engine_plugin.database_name("gpulse", tier) for tier in ("raw", *(t.name for t in TIERS))}
    assert databases == {"gpulse", "gpulse/1m", "gpulse/1h"} and len(databases) <= CORE_DATABASES
    assert all(len(_columns(tier)) < CORE_TABLES // 10 for tier in ("raw", "1m", "1h"))


def test_api_v3_without_a_url_looks_on_port_8181():
    assert resolve_connection(env={"GPULSE_API": "v3"}).url == "http://127.0.0.1:8181"
    assert resolve_connection(env={}).url == "http://127.0.0.1:8086"  # 1.x and 2.x stay where they listen
