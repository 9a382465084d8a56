"""The provisioned alert rules are well-formed Grafana unified-alerting files that reference what exists.

The rules' InfluxQL is executed, and their expressions evaluated, against real data in
``agent/tests/dashboards/test_dashboard_queries.py``; this module checks the file-provisioning structure.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gpulse.dashboards import ALERTS_PATH, alerts
from gpulse.dashboards.builder import DATASOURCE_UID
from gpulse.dashboards.influxql import check_references

REQUIRED = {
    "gpulse-gpu-idle-memory",
    "gpulse-gpu-throttled",
    "gpulse-gpu-xid",
    "gpulse-agent-silent",
    "gpulse-agent-spool-growing",
}


def _doc(repo_root: Path) -> dict[str, Any]:
    return yaml.safe_load((repo_root / ALERTS_PATH).read_text())


def _rules(repo_root: Path) -> list[dict[str, Any]]:
    return [r for g in _doc(repo_root)["groups"] for r in g["rules"]]


def test_the_file_is_provisioning_format_version_1_with_one_group_in_a_folder(repo_root: Path) -> None:
    doc = _doc(repo_root)
    assert doc["apiVersion"] == 1
    (group,) = doc["groups"]
    assert group["name"] and group["folder"] and re.fullmatch(r"\d+[smh]", group["interval"])
    assert group["orgId"] == 1
    assert doc == alerts.provisioning()


def test_the_five_required_rules_exist_with_unique_uids_and_titles(repo_root: Path) -> None:
    rules = _rules(repo_root)
    uids = [r["uid"] for r in rules]
    assert set(uids) == REQUIRED and len(uids) == len(set(uids))
    assert all(len(u) <= 40 for u in uids)
    assert len({r["title"] for r in rules}) == len(rules)


def test_each_rule_condition_and_expression_references_an_existing_ref_id(repo_root: Path) -> None:
    for r in _rules(repo_root):
        refs = [d["refId"] for d in r["data"]]
        assert len(refs) == len(set(refs)), r["uid"]
        assert r["condition"] in refs
        seen: set[str] = set()
        for d in r["data"]:
            m = d["model"]
            assert m["refId"] == d["refId"]
            if d["datasourceUid"] == "__expr__":
                used = set(re.findall(r"\$(\w+)", m["expression"])) if m["type"] == "math" else {m["expression"]}
                assert used and used <= seen, f"{r['uid']}: {d['refId']} uses {used - seen} before it exists"
                assert m["type"] in {"reduce", "math", "threshold"}
            else:
                assert d["datasourceUid"] == DATASOURCE_UID
                assert d["relativeTimeRange"]["from"] > 0 and d["relativeTimeRange"]["to"] == 0
            seen.add(d["refId"])
        assert r["data"][-1]["refId"] == r["condition"] and r["data"][-1]["model"]["type"] == "threshold"


def test_rule_queries_are_raw_influxql_over_schema_names_grouped_by_host(repo_root: Path) -> None:
    for r in _rules(repo_root):
        for d in r["data"]:
            if d["datasourceUid"] != DATASOURCE_UID:
                continue
            q = d["model"]["query"]
            assert d["model"]["rawQuery"] is True and "$timeFilter" in q
            assert check_references(q) == [], q
            assert "GROUP BY" in q and '"host"' in q.split("GROUP BY")[-1], q


def test_annotations_hold_no_dollar_sign_that_grafana_would_expand_from_the_environment(repo_root: Path) -> None:
    for r in _rules(repo_root):
        assert r["annotations"]["summary"] and r["annotations"]["description"]
        for text in (*r["annotations"].values(), *r["labels"].values(), r["title"]):
            assert "$" not in text, text
        assert r["labels"]["severity"] in {"warning", "critical"}
        assert r["noDataState"] in {"OK", "NoData", "Alerting"} and r["execErrState"] in {"Error", "Alerting", "OK"}
