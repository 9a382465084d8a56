"""The checked-in dashboards are the generator's Classic JSON, internally consistent, and use only schema names."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fixtures import REPO

from gpulse import schema
from gpulse.dashboards import DASHBOARDS_DIR, check, dashboards, rendered
from gpulse.dashboards.builder import DATASOURCE_UID
from gpulse.dashboards.influxql import (
    Variable,
    check_references,
    interpolate,
    references,
    tag_keys,
)
from gpulse.influx import downsample

DASHES = [d.to_json() for d in dashboards()]
V2_KEYS = {"apiVersion", "kind", "spec", "elements", "layout", "timeSettings"}


def _targets(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in dash["panels"] for t in p.get("targets", [])]


def _all_queries(dash: dict[str, Any]) -> list[str]:
    return (
        [t["query"] for t in _targets(dash)]
        + [v["query"] for v in dash["templating"]["list"]]
        + [a["query"] for a in dash["annotations"]["list"] if "query" in a]
    )


def test_checked_in_files_equal_the_generator_output(repo_root: Path) -> None:
    assert check(repo_root) == [], "run `make generate`"
    on_disk = sorted(p.relative_to(repo_root).as_posix() for p in (repo_root / DASHBOARDS_DIR).rglob("*.json"))
    assert on_disk == sorted(k for k in rendered() if k.startswith(DASHBOARDS_DIR)), "a stray dashboard file"


def test_a_stale_checked_in_dashboard_is_detected(tmp_path: Path) -> None:
    for rel, text in rendered().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert check(tmp_path) == []
    node = tmp_path / DASHBOARDS_DIR / "GPUs" / "node.json"
    node.write_text(node.read_text().replace("util_gpu_pct", "util_gpu"))
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
    assert {"gpulse-node", "gpulse-training-run", "gpulse-history", "gpulse-agent-health"} == set(uids)


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_panels_have_unique_ids_and_titles_and_do_not_overlap(dash: dict[str, Any]) -> None:
    ids = [p["id"] for p in dash["panels"]]
    assert len(set(ids)) == len(ids)
    titles = [p["title"] for p in dash["panels"] if p["type"] != "row"]
    assert len(set(titles)) == len(titles)
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_every_datasource_reference_is_the_provisioned_influxql_datasource(
    dash: dict[str, Any], repo_root: Path
) -> None:
    provisioned = yaml.safe_load((repo_root / "grafana/provisioning/datasources/influxdb.yaml").read_text())
    uids = {ds["uid"] for ds in provisioned["datasources"]}
    assert DATASOURCE_UID in uids
    refs = [p["datasource"] for p in dash["panels"] if "datasource" in p] + [t["datasource"] for t in _targets(dash)]
    refs += [v["datasource"] for v in dash["templating"]["list"]]
    refs += [a["datasource"] for a in dash["annotations"]["list"] if not a.get("builtIn")]
    assert refs and all(r == {"type": "influxdb", "uid": DATASOURCE_UID} for r in refs)


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_time_series_queries_are_raw_influxql_limited_by_the_time_filter(dash: dict[str, Any]) -> None:
    for t in _targets(dash):
        assert t["rawQuery"] is True and t["query"].lstrip().upper().startswith("SELECT")
        if t["resultFormat"] == "time_series":
            assert "$timeFilter" in t["query"], t["query"]
        if "GROUP BY time(" in t["query"] and "time(1d)" not in t["query"] and "time(1h)" not in t["query"]:
            assert "$__interval" in t["query"], t["query"]
    for a in dash["annotations"]["list"]:
        if "query" in a:
            assert "$timeFilter" in a["query"]


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_every_query_names_only_measurements_fields_and_tags_of_the_schema(dash: dict[str, Any]) -> None:
    problems = {q: check_references(q) for q in _all_queries(dash)}
    assert {q: p for q, p in problems.items() if p} == {}


@pytest.mark.parametrize("dash", DASHES, ids=lambda d: d["uid"])
def test_variables_list_tags_of_their_measurement_and_every_used_variable_is_defined(dash: dict[str, Any]) -> None:
    names = [v["name"] for v in dash["templating"]["list"]]
    for v in dash["templating"]["list"]:
        (key,) = tag_keys(v["query"])
        ((_, measurement),) = references(v["query"]).sources
        assert key in schema.MEASUREMENTS[measurement].all_tags
    selection = {n: Variable(("x",)) for n in names}
    for q in _all_queries(dash):
        interpolate(q, selection)  # raises KeyError on an undefined $variable
        for n in names:
            if f"${n}" in q or f"${{{n}" in q:
                assert re.search(rf"=~ /\^(\${n}|\${{{n}:regex}})\$/", q), f"${n} used outside an anchored regex: {q}"


def test_the_history_dashboard_reads_only_the_downsampled_retention_policies() -> None:
    (history,) = [d for d in DASHES if d["uid"] == "gpulse-history"]
    for t in _targets(history):
        rps = {rp for rp, _ in references(t["query"]).sources}
        assert rps and rps <= {"1m", "1h"}, t["query"]
    assert history["time"]["from"] == "now-30d"


def test_downsampled_names_the_checker_accepts_are_what_the_downsampling_writes() -> None:
    written = downsample.output_fields()
    for m in downsample.downsampled_measurements():
        for name in written[m.name]:
            assert check_references(f'SELECT "{name}" FROM "gpulse"."1h"."{m.name}"') == []
    assert check_references('SELECT max("clock_event_reasons_max") FROM "gpulse"."1h"."gpu"')
    assert check_references('SELECT max("energy_mj_max") FROM "gpulse"."1h"."gpu"')  # counters keep last only


def test_the_reference_checker_reports_misspelled_names_and_missing_downsampled_data() -> None:
    assert check_references('SELECT mean("util_gpu") FROM "gpu" WHERE $timeFilter')
    assert check_references('SELECT mean("util_gpu_pct") FROM "gpus" WHERE $timeFilter')
    assert check_references('SELECT last("name") FROM "gpulse"."1h"."gpu_info"')
    assert check_references('SELECT mean("util_gpu_pct") FROM "gpu" WHERE "hostname" =~ /^$host$/')
    assert check_references('SELECT mean("log_loss") FROM "gpulse"."1h"."train_step"')  # open fields stay raw
    assert check_references('SELECT mean("log_loss") FROM "train_step" WHERE "run" =~ /^x$/') == []
    assert check_references('SELECT mean("v") AS "w" FROM (SELECT mean("step_time_s") AS "v" FROM "train_step")') == []


def test_interpolation_formats_variables_like_grafana() -> None:
    hosts = Variable(("node-a", "node.b"))
    one = Variable(("run/1",), multi=False)
    q = 'SELECT 1 FROM "gpu" WHERE "host" =~ /^$host$/ AND "run" =~ /^${run:regex}$/ AND $timeFilter GROUP BY time($__interval)'
    assert interpolate(q, {"host": hosts, "run": one}, time_from="now-6h", interval="10s") == (
        'SELECT 1 FROM "gpu" WHERE "host" =~ /^(node-a|node\\.b)$/ AND "run" =~ /^run\\/1$/ '
        "AND time >= now() - 6h and time <= now() GROUP BY time(10s)"
    )
    assert interpolate("$run", {"run": one}) == "run/1"
    with pytest.raises(KeyError):
        interpolate("$nope", {})


def test_the_home_dashboard_and_docs_exist(repo_root: Path) -> None:
    assert (repo_root / DASHBOARDS_DIR / "GPUs" / "node.json").exists()
    docs = (repo_root / "docs/dashboards.md").read_text()
    for d in DASHES:
        assert f"## {d['title']}" in docs
        for p in d["panels"]:
            if p["type"] != "row":
                assert f"**{p['title']}**" in docs
