"""The checked-in dashboards are the generator's Classic JSON, internally consistent, and use only schema names."""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fixtures import REPO
from support.grafana_interpolate import Selection, interpolate
from support.influxql_checks import check_references, plain_field, select_columns, tag_keys

from gpulse import schema
from gpulse.dashboards import DASHBOARDS_DIR, alerts, check, dashboards, datasources, node, rendered, training
from gpulse.dashboards.builder import DATASOURCE_UID, DATASOURCE_UIDS, MIXED, Panel
from gpulse.dashboards.influxql import references
from gpulse.dashboards.units import SCHEMA_UNITS
from gpulse.influx import downsample
from gpulse.influx.tiers import RAW

BUILT = dashboards()
DASHES = [d.to_json() for d in BUILT]
BY_UID = {d["uid"]: d for d in DASHES}
V2_KEYS = {"apiVersion", "kind", "spec", "elements", "layout", "timeSettings"}


def _targets(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in dash["panels"] for t in p.get("targets", [])]


def _annotations(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in dash["annotations"]["list"] if not a.get("builtIn")]


def _query_variables(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in dash["templating"]["list"] if v["type"] == "query"]


def _all_queries(dash: dict[str, Any]) -> list[str]:
    return (
        [t["query"] for t in _targets(dash)]
        + [v["query"] for v in _query_variables(dash)]
        + [a["target"]["query"] for a in _annotations(dash)]
    )


def _links(dash: dict[str, Any]) -> list[str]:
    """Every data-link URL of every panel: field defaults and overrides."""
    out = []
    for p in dash["panels"]:
        fc = p.get("fieldConfig", {})
        out += [link["url"] for link in fc.get("defaults", {}).get("links", [])]
        for o in fc.get("overrides", []):
            out += [link["url"] for prop in o["properties"] if prop["id"] == "links" for link in prop["value"]]
    return out


def test_checked_in_files_equal_the_generator_output(repo_root: Path) -> None:
    assert check(repo_root) == [], "run `make generate`"
    on_disk = sorted(p.relative_to(repo_root).as_posix() for p in (repo_root / DASHBOARDS_DIR).rglob("*.json"))
    assert on_disk == sorted(k for k in rendered() if k.startswith(DASHBOARDS_DIR)), "a stray dashboard file"


def test_a_stale_checked_in_dashboard_is_detected(tmp_path: Path) -> None:
    for rel, text in rendered().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert check(tmp_path) == []
    node_json = tmp_path / DASHBOARDS_DIR / "GPUs" / "node.json"
    node_json.write_text(node_json.read_text().replace("util_gpu_pct", "util_gpu"))
    assert check(tmp_path) == [f"{DASHBOARDS_DIR}/GPUs/node.json"]


@pytest.mark.parametrize("path", sorted(REPO.joinpath(DASHBOARDS_DIR).rglob("*.json")), ids=str)
def test_every_dashboard_file_is_classic_json_never_the_v2_format(path: Path) -> None:
    doc = json.loads(path.read_text())
    assert not V2_KEYS & set(doc), f"{path} is in the Grafana 13 v2 format"
    assert {"uid", "title", "schemaVersion", "panels", "templating", "annotations", "time"} <= set(doc)
    assert isinstance(doc["schemaVersion"], int) and doc["schemaVersion"] >= 39
    assert all("elements" not in p and "spec" not in p for p in doc["panels"])


def test_dashboard_uids_and_titles_are_unique_and_stable() -> None:
    uids = [d["uid"] for d in DASHES]
    titles = [d["title"] for d in DASHES]
    assert len(set(uids)) == len(uids) and len(set(titles)) == len(titles)
    assert all(re.fullmatch(r"[a-z0-9-]{1,40}", u) for u in uids)
    assert {"gpulse-node", "gpulse-training-run", "gpulse-history", "gpulse-agent-health", "gpulse-runbook"} == set(
        uids
    )


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_panels_have_unique_ids_titles_and_a_description_and_do_not_overlap(dash: dict[str, Any]) -> None:
    ids = [p["id"] for p in dash["panels"]]
    assert len(set(ids)) == len(ids)
    titles = [p["title"] for p in dash["panels"] if p["type"] != "row"]
    assert len(set(titles)) == len(titles)
    cells: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        if p["type"] != "row":
            assert len(p.get("description", "")) >= 20, f"{p['title']} has no description"
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for cell in ((x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])):
            assert cell not in cells, f"{p['title']} overlaps {cells[cell]}"
            cells[cell] = p["title"]


def test_the_overlap_check_catches_an_overlap() -> None:
    """The public DCGM board 12239 has one (Tensor Core Utilization over GPU Utilization); ours must not."""
    dash = json.loads(json.dumps(BY_UID["gpulse-agent-health"]))
    a, b = [p for p in dash["panels"] if p["type"] == "timeseries"][:2]
    b["gridPos"] = dict(a["gridPos"])
    with pytest.raises(AssertionError, match="overlaps"):
        test_panels_have_unique_ids_titles_and_a_description_and_do_not_overlap(dash)


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_every_query_goes_to_the_datasource_of_the_tier_its_retention_policy_names(
    dash: dict[str, Any], repo_root: Path
) -> None:
    """On InfluxDB 3 the datasource picks the tier (the retention policy is dropped), on 2.x the
    retention policy does: the two must agree, and both provisioning files must define every uid."""
    for backend in datasources.BACKENDS:
        provisioned = yaml.safe_load((repo_root / backend.path).read_text())
        assert {ds["uid"] for ds in provisioned["datasources"]} == set(DATASOURCE_UIDS.values()), backend.path
    by_uid = {uid: tier for tier, uid in DATASOURCE_UIDS.items()}
    sent = [(t["datasource"], t["query"]) for t in _targets(dash)] + [
        (v["datasource"], v["query"]) for v in _query_variables(dash)
    ]
    sent += [(a["datasource"], a["target"]["query"]) for a in _annotations(dash)]
    for ref, q in sent:
        assert ref["type"] == "influxdb" and ref["uid"] in by_uid, q
        tiers = {rp or RAW for rp, _ in references(q).sources}
        if q == training.RUNS_LATEST_FIRST:  # also asks the 1m tier on 1.x/2.x; a no-op on 3.x (its docstring)
            assert ref["uid"] == DATASOURCE_UID and tiers == {RAW, "1m"}
            continue
        assert tiers == {by_uid[ref["uid"]]}, q
    for p in dash["panels"]:
        if "targets" in p:
            uids = {t["datasource"]["uid"] for t in p["targets"]}
            assert p["datasource"] == ({"type": "influxdb", "uid": uids.pop()} if len(uids) == 1 else MIXED), p["title"]


#: A time bound InfluxDB 3 Core needs on every query: the range's filter or an explicit one.
TIME_BOUND = re.compile(r"\$timeFilter|\btime\s*(>=?|<=?)\s*(now\(\)|\$\{__(from|to)\}ms)")


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_every_query_variable_and_annotation_names_a_time_range(dash: dict[str, Any]) -> None:
    """Core fails an unbounded query on its Parquet file limit, and its SHOW TAG VALUES sees only
    the last day without a range; every statement (each subquery too) must be bounded by time."""
    for q in _all_queries(dash):
        for part in _levels(q):
            if re.search(r'\bFROM\s+"', part):  # reads a measurement, not only a subquery's rows
                assert TIME_BOUND.search(part), f"unbounded: {part!r} in {q}"


def _levels(query: str) -> list[str]:
    """Each statement and each subquery on its own, its nested subqueries cut out as ``(...)``."""
    out, stack = [], [""]
    i = 0
    while i < len(query):
        if query.startswith("(SELECT", i):
            stack.append("")
            i += 1
            continue
        c = query[i]
        if c == ")" and len(stack) > 1 and stack[-1].count("(") == stack[-1].count(")"):
            out.append(stack.pop())
            stack[-1] += "(...)"
        elif c == ";" and len(stack) == 1:
            out.append(stack.pop())
            stack.append("")
        else:
            stack[-1] += c
        i += 1
    return out + stack


def test_the_time_bound_check_catches_an_unbounded_query_and_subquery() -> None:
    for q in ('SELECT "x" FROM "gpu" WHERE "host" = \'a\'', 'SHOW TAG VALUES FROM "gpu" WITH KEY = "host"'):
        dash = {"panels": [{"targets": [{"query": q}]}], "templating": {"list": []}, "annotations": {"list": []}}
        with pytest.raises(AssertionError, match="unbounded"):
            test_every_query_variable_and_annotation_names_a_time_range(dash)
    sub = 'SELECT sum("v") FROM (SELECT mean("x") AS "v" FROM "gpu" GROUP BY "host") WHERE $timeFilter'
    dash = {"panels": [{"targets": [{"query": sub}]}], "templating": {"list": []}, "annotations": {"list": []}}
    with pytest.raises(AssertionError, match="unbounded"):
        test_every_query_variable_and_annotation_names_a_time_range(dash)


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_queries_are_raw_influxql_limited_by_the_time_filter_or_a_stated_window(dash: dict[str, Any]) -> None:
    for t in _targets(dash):
        q = t["query"]
        assert t["rawQuery"] is True and q.lstrip().upper().startswith("SELECT")
        if t["resultFormat"] == "time_series":
            assert "$timeFilter" in q or "now() - " in q, q
        if "GROUP BY time(" in q and not re.search(r"time\((1d|1h|1m)\)", q):
            assert "$__interval" in q, q


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_annotations_use_the_current_form_with_the_query_and_its_columns_in_the_target(dash: dict[str, Any]) -> None:
    for a in _annotations(dash):
        assert not {"query", "textColumn", "tagsColumn", "titleColumn", "timeEndColumn", "rawQuery"} & set(a), a
        t = a["target"]
        assert t["rawQuery"] is True and t["fromAnnotations"] is True and t["refId"] and t["queryType"]
        assert "$timeFilter" in t["query"]
        assert {"textColumn", "tagsColumn", "titleColumn", "timeEndColumn"} <= set(t)
        selected = {name for _, name in select_columns(t["query"])}
        for column in ("textColumn", "tagsColumn", "titleColumn", "timeEndColumn"):
            assert t[column] == "" or t[column] in selected, f"{a['name']}: {column} {t[column]!r} is not selected"


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_no_query_names_the_database_so_any_bucket_name_works(dash: dict[str, Any]) -> None:
    for q in _all_queries(dash):
        for m in re.finditer(r'\bFROM\s+((?:"[^"]+"\.)*"[^"]+")', q, re.IGNORECASE):
            assert m.group(1).count('"."') <= 1, f"names a database: {q}"


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_every_query_names_only_measurements_fields_and_tags_of_the_schema(dash: dict[str, Any]) -> None:
    problems = {q: check_references(q) for q in _all_queries(dash)}
    assert {q: p for q, p in problems.items() if p} == {}


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_variables_list_tags_of_their_measurement_and_every_used_variable_is_defined(dash: dict[str, Any]) -> None:
    names = [v["name"] for v in dash["templating"]["list"]]
    for v in _query_variables(dash):
        ((_, measurement),) = references(v["query"]).sources[:1]
        keys = tag_keys(v["query"]) or [re.search(r'"(\w+)" AS "\w+"', v["query"]).group(1)]  # type: ignore[union-attr]
        assert set(keys) <= set(schema.MEASUREMENTS[measurement].all_tags)
    selection = {n: Selection(("x",)) for n in names}
    settings = {v["name"] for v in dash["templating"]["list"] if v["type"] == "textbox"}
    for q in _all_queries(dash):
        interpolate(q, selection)  # raises KeyError on an undefined $variable
        for n in names:
            if n in settings:  # a duration, subtracted from a time
                assert len(re.findall(rf"\${n}\b", q)) == len(re.findall(rf" - \${n}\b", q)), (
                    f"${n} not a duration: {q}"
                )
            elif f"${n}" in q or f"${{{n}" in q:
                assert re.search(rf"=~ /\^(\${n}|\${{{n}:regex}})\$/", q), f"${n} used outside an anchored regex: {q}"


def test_the_history_dashboard_reads_only_the_downsampled_tiers_its_host_list_included() -> None:
    history = BY_UID["gpulse-history"]
    for q in [t["query"] for t in _targets(history)] + [v["query"] for v in _query_variables(history)]:
        rps = {rp for rp, _ in references(q).sources}
        assert rps and rps <= {"1m", "1h"}, q
    assert history["time"]["from"] == "now-30d"


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_a_dashboard_that_groups_by_day_is_in_utc_like_influxql_days(dash: dict[str, Any]) -> None:
    by_day = any("time(1d)" in q for q in _all_queries(dash))
    assert dash["timezone"] == ("utc" if by_day else "browser")
    if by_day:
        days = [p for p in dash["panels"] if any("time(1d)" in t["query"] for t in p.get("targets", []))]
        assert days and all("UTC day" in p["description"] for p in days), [p["title"] for p in days]


def test_the_run_variable_lists_the_latest_run_first_and_keeps_that_order() -> None:
    (run,) = [v for v in BY_UID["gpulse-training-run"]["templating"]["list"] if v["name"] == "run"]
    assert run["sort"] == 0 and not run["multi"] and not run["includeAll"]
    statements = run["query"].split("; ")
    assert len(statements) == 2  # runs raw still holds the start of, then older runs from the 1m tier
    for statement in statements:
        assert statement.rstrip().endswith("ORDER BY time DESC")
        assert [name for _, name in select_columns(statement)] == ["r"]  # one column: Grafana reads it in row order


def test_node_opens_on_one_host_with_every_gpu_and_keeps_per_gpu_plots_wide() -> None:
    n = BY_UID["gpulse-node"]
    host, job, gpu = n["templating"]["list"]
    assert (host["name"], host["includeAll"], gpu["name"], gpu["includeAll"]) == ("host", False, "gpu", True)
    assert (job["name"], job["includeAll"], job["allValue"]) == ("job", True, ".*")  # All keeps untagged GPUs
    assert '"job" =~ /^$job$/' in gpu["query"]
    per_gpu = [p for p in n["panels"] if any("$tag_gpu" in t.get("alias", "") for t in p.get("targets", []))]
    assert per_gpu
    for p in per_gpu:
        if p["type"] == "timeseries":
            legend = p["options"]["legend"]
            assert legend["placement"] == "right" and legend["displayMode"] == "list" and legend["width"] <= 200, p[
                "title"
            ]
            assert p["options"]["tooltip"]["sort"] == "desc", p["title"]


def _dashboard_of_link(url: str) -> tuple[str, dict[str, list[str]]]:
    parsed = urllib.parse.urlparse(url)
    m = re.fullmatch(r"/d/([a-z0-9-]+)(?:/[\w-]+)?", parsed.path)
    assert m, url
    query = parsed.query.replace("${__url_time_range}", "")
    return m.group(1), urllib.parse.parse_qs(query, keep_blank_values=True)


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_every_link_resolves_to_a_dashboard_that_exists_and_its_variables(dash: dict[str, Any]) -> None:
    for url in _links(dash):
        uid, params = _dashboard_of_link(url)
        assert uid in BY_UID, url
        target_vars = {v["name"] for v in BY_UID[uid]["templating"]["list"]}
        assert {k.removeprefix("var-") for k in params if k.startswith("var-")} <= target_vars, url
        assert "${__url_time_range}" in url, f"{url} drops the time range"


def test_links_follow_the_questions_a_user_asks() -> None:
    run_gpus = [p for p in BY_UID["gpulse-training-run"]["panels"] if p["title"] == "GPU activity of the run"]
    (url,) = _links({"panels": run_gpus})
    assert _dashboard_of_link(url) == (
        "gpulse-node",
        {"var-host": ["${__field.labels.host}"], "var-gpu": ["${__field.labels.gpu}"]},
    )
    runs = [p for p in BY_UID["gpulse-history"]["panels"] if p["title"] == "Runs in range"]
    (url,) = _links({"panels": runs})
    assert _dashboard_of_link(url) == ("gpulse-training-run", {"var-run": ["${__value.raw}"]})
    assert node.link_to_gpu().dashboard == node.UID and training.UID in BY_UID


def test_every_alert_opens_an_existing_panel_and_runbook() -> None:
    for r in alerts.rules():
        ann = r["annotations"]
        dash = BY_UID[ann["__dashboardUid__"]]
        (panel,) = [p for p in dash["panels"] if str(p["id"]) == ann["__panelId__"]]
        assert panel["type"] != "row"
        uid, params = _dashboard_of_link(ann["runbook_url"])
        assert uid == alerts.RUNBOOK_UID
        (runbook,) = [p for p in BY_UID[uid]["panels"] if f"panel-{p['id']}" == params["viewPanel"][0]]
        assert runbook["title"] == r["title"] and runbook["type"] == "text" and len(runbook["options"]["content"]) > 100


def _columns_with_units(p: Panel) -> list[tuple[str, str, str, str]]:
    """(measurement, column expression, column name, unit quantity) of every column a unit applies to."""
    out = []
    for q in p.queries:
        measurement = _measurement(q.sql)
        cols = select_columns(q.sql)
        if q.unit is not None:
            out += [(measurement, expr, name, q.unit.quantity) for expr, name in cols]
        by_name = {name: expr for expr, name in cols}
        for c in p.columns:
            if (source := _query_column(c.name, p.transformations)) in by_name:
                out.append((measurement, by_name[source], c.name, c.unit.quantity))
    return out


def _query_column(shown: str, transformations: list[dict[str, Any]]) -> str:
    """The query column a table shows as ``shown``: the panel's transformations walked backwards,
    an ``organize`` rename undone, a ``groupBy`` aggregate's ``"field (calculation)"`` name back to
    its field (the name Grafana's groupBy transformer gives it)."""
    name = shown
    for t in reversed(transformations):
        if t["id"] == "organize":
            name = {new: old for old, new in t["options"].get("renameByName", {}).items()}.get(name, name)
        elif t["id"] == "groupBy":
            m = re.fullmatch(r"(.+) \((\w+)\)", name)
            if m and t["options"]["fields"].get(m[1], {}).get("operation") == "aggregate":
                name = m[1]
    return name


def test_a_table_column_is_traced_back_through_renames_and_aggregations_to_its_query_column() -> None:
    (processes,) = [p for p in node.build().panels() if p.title == "Processes"]
    shown = {c.name: _query_column(c.name, processes.transformations) for c in processes.columns}
    assert shown["PID"] == "pid"
    assert shown["GPU memory"] == shown["peak GPU memory"] == "mem_used_bytes"
    assert shown["last seen"] == "Time"
    assert _query_column("user", processes.transformations) == "user"  # neither renamed nor aggregated


def _measurement(sql: str) -> str:
    sources = references(sql).sources
    return sources[0][1] if sources else ""


def _numeric(measurement: str, expr: str) -> bool:
    """Whether a SELECT column holds numbers: a stored field of a numeric type, or any computation."""
    field, m = plain_field(expr), schema.MEASUREMENTS.get(measurement)
    if field is None or m is None or field not in m.by_name:
        return True
    return m.by_name[field].numeric


@pytest.mark.parametrize("built", BUILT, ids=lambda d: d.uid)
def test_a_field_shown_as_stored_uses_a_unit_of_the_schemas_quantity(built: Any) -> None:
    checked = 0
    for p in built.panels():
        for measurement, expr, name, quantity in _columns_with_units(p):
            field = plain_field(expr)
            m = schema.MEASUREMENTS.get(measurement)
            if field is None or m is None:
                continue
            base = re.sub(r"_(max|min)$", "", field) if field not in m.by_name else field
            if base not in m.by_name:
                continue
            allowed = SCHEMA_UNITS[m.by_name[base].unit]
            assert quantity in allowed, (
                f"{built.title} / {p.title} / {name}: {field} is {m.by_name[base].unit}, shown as {quantity}"
            )
            checked += 1
    if built.uid != alerts.RUNBOOK_UID:
        assert checked >= 3


@pytest.mark.parametrize("built", BUILT, ids=lambda d: d.uid)
def test_every_numeric_table_column_and_query_has_its_own_unit(built: Any) -> None:
    for p in built.panels():
        if p.type == "text":
            continue
        if p.type == "table":
            with_units = {_query_column(c.name, p.transformations) for c in p.columns}
            for q in p.queries:
                assert q.unit is None, f"{p.title}: a table gets units per column"
                numeric = [name for expr, name in select_columns(q.sql) if _numeric(_measurement(q.sql), expr)]
                assert set(numeric) <= with_units, f"{p.title}: {set(numeric) - with_units} without a unit"
        else:
            assert all(q.unit is not None for q in p.queries), f"{p.title}: a query without a unit"


def test_downsampled_names_the_checker_accepts_are_what_the_downsampling_writes() -> None:
    for m in downsample.downsampled_measurements():
        for name in {out for p in downsample.pipelines(downsample.TIERS[0]) for _, out in p.outputs(m.name)}:
            assert check_references(f'SELECT "{name}" FROM "1h"."{m.name}"') == []
    assert check_references('SELECT max("clock_event_reasons_max") FROM "1h"."gpu"')
    assert check_references('SELECT max("energy_mj_max") FROM "1h"."gpu"')  # counters keep last only


def test_the_reference_checker_reports_misspelled_names_missing_downsampled_data_and_database_names() -> None:
    assert check_references('SELECT mean("util_gpu") FROM "gpu" WHERE $timeFilter')
    assert check_references('SELECT mean("util_gpu_pct") FROM "gpus" WHERE $timeFilter')
    assert check_references('SELECT last("name") FROM "1h"."gpu_info"')
    assert check_references('SELECT mean("util_gpu_pct") FROM "gpu" WHERE "hostname" =~ /^$host$/')
    assert check_references('SELECT mean("log_loss") FROM "1h"."train_step"')  # open fields stay raw
    assert check_references('SELECT mean("log_loss") FROM "train_step" WHERE "run" =~ /^x$/') == []
    assert check_references('SELECT mean("v") AS "w" FROM (SELECT mean("step_time_s") AS "v" FROM "train_step")') == []
    with pytest.raises(ValueError, match="names the database"):
        check_references('SELECT mean("util_gpu_pct") FROM "gpulse"."1h"."gpu"')


def test_interpolation_formats_variables_like_grafana() -> None:
    """What ``interpolateQueryExpr``, scenes' format registry and the backend's ``Query.Build`` make of a query."""
    hosts = Selection(("node-a", "node.b"))
    one = Selection(("run/1",), multi=False)
    q = 'SELECT 1 FROM "gpu" WHERE "host" =~ /^$host$/ AND "run" =~ /^${run:regex}$/ AND $timeFilter GROUP BY time($__interval)'
    assert interpolate(q, {"host": hosts, "run": one}, interval="10s", from_ms=1000, to_ms=2000) == (
        'SELECT 1 FROM "gpu" WHERE "host" =~ /^(node-a|node\\.b)$/ AND "run" =~ /^run\\/1$/ '
        "AND time >= 1000ms and time <= 2000ms GROUP BY time(10s)"
    )
    # a multi-value variable is always a group, even of one value; a number is never escaped
    assert interpolate("$host", {"host": Selection(("node.b",))}) == "(node\\.b)"
    assert interpolate("$rank", {"rank": Selection(("1.5",), multi=False)}) == "1.5"
    # a single value is escaped only where the query uses it, as $name, in a regex
    assert interpolate("$run", {"run": one}) == "run/1"
    assert interpolate('"run" =~ /^$run$/', {"run": one}) == '"run" =~ /^run\\/1$/'
    assert interpolate('"run" =~ /^${run}$/', {"run": one}) == '"run" =~ /^run/1$/'
    # "All" with a custom allValue is that value, unescaped; without one, every option
    assert interpolate("/^$job$/", {"job": Selection((), all_value=".*")}) == "/^.*$/"
    every = Selection(("a", "b"), multi=False, all=True)
    assert interpolate('"h" =~ /^$h$/ OR $h', {"h": every}) == '"h" =~ /^(a|b)$/ OR (a|b)'
    assert interpolate("${h:csv} [[h:pipe]] ${h:glob}", {"h": every}) == "a,b a|b {a,b}"
    assert interpolate("time <= ${__to}ms", {}, from_ms=1, to_ms=2) == "time <= 2ms"
    assert interpolate("$__interval_ms $interval", {}, interval="1m") == "60000 1m"
    with pytest.raises(KeyError):
        interpolate("$nope", {})
    with pytest.raises(KeyError):  # not a macro of InfluxQL queries, which Grafana passes on as written
        interpolate("WHERE $__timeFilter", {})


def test_the_home_dashboard_and_docs_exist(repo_root: Path) -> None:
    assert (repo_root / DASHBOARDS_DIR / "GPUs" / "node.json").exists()
    docs = (repo_root / "docs/dashboards.md").read_text()
    for d in DASHES:
        assert f"## {d['title']}" in docs
        for p in d["panels"]:
            if p["type"] not in ("row", "text"):
                assert f"**{p['title']}**" in docs
    for r in alerts.catalogue():
        assert f"### Runbook: {r.title}" in docs and r.runbook in docs
