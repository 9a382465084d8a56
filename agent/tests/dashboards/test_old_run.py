"""A run older than raw retention opens in the Training run dashboard from the 1m tier (real InfluxDB 1.6.7).

``gpulse setup --api v1 --raw-retention 1h`` (the shortest it allows) makes the database. A run of
three days ago is older than that retention: InfluxDB refuses its points into ``raw``, and what it
keeps of such a run is its 1m tier (:mod:`support.old_run` puts it there). A second run, of now, is written to raw as the
agent would. The dashboard is opened the way a user opens it on a stack with that retention
(``var-raw_retention=1h``), and its queries run as Grafana sends them (:mod:`support.grafana_queries`).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from support.grafana_queries import data_rows, panel_queries, resolve_variables
from support.old_run import NS, run_points, setup_v1, write_to_1m_only

from gpulse.dashboards import training
from gpulse.dashboards.builder import DATASOURCE_UIDS

pytestmark = pytest.mark.influxdb

OLD, NEW, HOST = "old-run", "new-run", "node-a"
OLD_AGE_S = 3 * 86400
RANGE = "now-4d"
#: Panels with nothing in the 1m tier, and why: logged scalars and train_run/train_event/train_finding
#: are raw only.
RAW_ONLY = {"Loss", "Run", "Findings while running"}


@pytest.fixture(scope="module")
def stack(influxdb_module: Any) -> dict[str, Any]:
    influx = influxdb_module
    setup_v1(influx.url, raw_retention="1h")
    now = time.time_ns()
    old_start = now - OLD_AGE_S * NS
    old = run_points(OLD, HOST, old_start, 300)
    with pytest.raises(Exception, match="400"):
        influx.write(old)  # refused by raw: older than its retention
    write_to_1m_only(influx, old, old_start, now)
    influx.write(run_points(NEW, HOST, now - 660 * NS, 600))  # two 5-minute intervals at least: differences need two
    assert influx.rows(f'SELECT count("step_time_s") FROM "gpulse"."raw"."train_step" WHERE "run" = \'{OLD}\'') == []
    return {"influx": influx}


def _rows_by_tier(influx: Any, run: str) -> dict[str, dict[str, int]]:
    """Data rows per panel title and tier, with ``run`` picked on the dashboard."""
    dash = training.build().to_json()
    variables = resolve_variables(influx, dash, RANGE, {"raw_retention": "1h", "run": run})
    by_uid = {uid: tier for tier, uid in DATASOURCE_UIDS.items()}
    rows: dict[str, dict[str, int]] = {}
    for p, t, q in panel_queries(dash, variables, RANGE):
        tier = by_uid[t["datasource"]["uid"]]
        rows.setdefault(p["title"], {}).setdefault(tier, 0)
        rows[p["title"]][tier] += data_rows(influx, q)
    return rows


def test_the_run_list_offers_the_run_whose_start_raw_retention_dropped_after_the_current_one(
    stack: dict[str, Any],
) -> None:
    dash = training.build().to_json()
    variables = resolve_variables(stack["influx"], dash, RANGE, {"raw_retention": "1h", "run": OLD})
    assert variables["run"].values == (OLD,)
    default = resolve_variables(stack["influx"], dash, RANGE, {"raw_retention": "1h"})
    assert default["run"].values == (NEW,)  # the latest first: the dashboard opens on the current run


def test_a_run_older_than_raw_retention_fills_every_panel_the_1m_tier_can_from_that_tier(
    stack: dict[str, Any],
) -> None:
    rows = _rows_by_tier(stack["influx"], OLD)
    assert all(r.get("raw", 0) == 0 for r in rows.values()), rows  # raw holds none of it
    empty = {title for title, r in rows.items() if not r.get("1m")}
    assert empty == RAW_ONLY, rows
    assert all("1m" not in rows[title] for title in RAW_ONLY)  # never asked: the 1m tier does not keep them


def test_the_current_run_is_read_from_raw_only(stack: dict[str, Any]) -> None:
    rows = _rows_by_tier(stack["influx"], NEW)
    assert all(r.get("1m", 0) == 0 for r in rows.values()), rows
    assert {title for title, r in rows.items() if not r.get("raw")} == set(), rows


def test_a_gauges_peak_comes_from_its_max_column_in_the_1m_tier(stack: dict[str, Any]) -> None:
    """The 1m tier keeps a gauge's mean under its name: a peak read from it would be the mean's peak."""
    dash = training.build().to_json()
    variables = resolve_variables(stack["influx"], dash, RANGE, {"raw_retention": "1h", "run": OLD})
    # the tier by its datasource, not by "1m" in the text: a time filter's epoch ms ("...861ms") holds "1m" too
    (q,) = [
        q
        for p, t, q in panel_queries(dash, variables, RANGE)
        if p["title"] == "Peak memory" and t["datasource"]["uid"] == DATASOURCE_UIDS["1m"]
    ]
    assert 'max("mem_peak_bytes_max")' in q
    (res,) = stack["influx"].query(q, db="gpulse")["results"]
    assert res["series"][0]["values"][0][1] == 32 << 30  # the highest step's peak, not a per-minute mean
