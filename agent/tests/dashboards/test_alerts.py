"""The provisioned alerting: rules that say what they measured and open their panel, and contact points that reach somebody.

The rules' InfluxQL is executed, and their expressions evaluated, against real data in
``agent/tests/dashboards/test_dashboard_queries.py``; this module checks the file-provisioning
structure, renders the annotation templates the way Grafana's template expander would for the
subset they use, and expands the provisioned values the way Grafana's provisioning does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.influxql_checks import check_references

from gpulse.dashboards import ALERTS_PATH, WEBHOOK_DEFAULT_PATH, alerts, dashboards
from gpulse.dashboards.builder import DATASOURCE_UID

REQUIRED = {
    "gpulse-gpu-idle-memory",
    "gpulse-gpu-throttled",
    "gpulse-gpu-hot",
    "gpulse-gpu-xid",
    "gpulse-gpu-ecc-uncorrected",
    "gpulse-agent-silent",
    "gpulse-agent-spool-growing",
    "gpulse-run-finding",
}
#: Rules about events that must notify at once; every other rule waits before firing. A run's
#: finding has waited already: the agent raises it only after its rule held for a whole window.
IMMEDIATE = {"gpulse-gpu-xid", "gpulse-gpu-ecc-uncorrected", "gpulse-run-finding"}


def _doc(repo_root: Path) -> dict[str, Any]:
    return yaml.safe_load((repo_root / ALERTS_PATH).read_text())


def _rules(repo_root: Path) -> list[dict[str, Any]]:
    return [r for g in _doc(repo_root)["groups"] for r in g["rules"]]


def _seconds(duration: str) -> int:
    m = re.fullmatch(r"(\d+)([smh])", duration)
    assert m, duration
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def test_the_file_is_provisioning_format_version_1_with_one_group_in_a_folder(repo_root: Path) -> None:
    doc = _doc(repo_root)
    assert doc["apiVersion"] == 1
    (group,) = doc["groups"]
    assert group["name"] and group["folder"] and re.fullmatch(r"\d+[smh]", group["interval"])
    assert group["orgId"] == 1
    assert doc == alerts.provisioning()


def test_the_required_rules_exist_with_unique_uids_and_titles(repo_root: Path) -> None:
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


def test_every_rule_waits_a_sensible_time_unless_it_reports_an_event(repo_root: Path) -> None:
    for r in _rules(repo_root):
        wait = _seconds(r["for"])
        if r["uid"] in IMMEDIATE:
            assert wait == 0, r["uid"]
        else:
            assert 60 <= wait <= 3600, f"{r['uid']} waits {r['for']}"
        assert r["noDataState"] in {"OK", "NoData", "Alerting"} and r["execErrState"] in {"Error", "Alerting", "OK"}
        assert r["labels"] == {"severity": r["labels"]["severity"], "source": "gpulse"}
        assert r["labels"]["severity"] in {"warning", "critical"}


def test_annotations_hold_no_dollar_sign_that_grafana_would_expand_from_the_environment(repo_root: Path) -> None:
    for r in _rules(repo_root):
        for text in (*r["annotations"].values(), *r["labels"].values(), r["title"]):
            assert "$" not in text, text


# -- the annotation templates ----------------------------------------------------------------------
_ACTION = re.compile(r"\{\{(.*?)\}\}")
_VALUE = r'\(index \.Values "(\w+)"\)\.Value'


def render_template(text: str, labels: dict[str, str], values: dict[str, float]) -> str:
    """Grafana's alert template expander for the forms the rules use, and nothing else.

    Grafana runs annotations through Prometheus' template expander with ``.Labels`` and
    ``.Values`` (pkg/services/ngalert/state/template); ``(index .Values "ref").Value`` is the
    reduce result. An action outside this subset fails, so a template never goes unchecked.
    """

    def action(m: re.Match[str]) -> str:
        body = m.group(1).strip()
        if label := re.fullmatch(r'index \.Labels "(\w+)"', body):
            return labels[label.group(1)]
        if fmt := re.fullmatch(rf'printf "(%\.\d+f)" {_VALUE}', body):
            return fmt.group(1) % values[fmt.group(2)]
        if size := re.fullmatch(rf"humanize1024 {_VALUE}", body):
            v, suffixes = values[size.group(1)], ["", "Ki", "Mi", "Gi", "Ti"]
            i = 0
            while abs(v) >= 1024 and i < len(suffixes) - 1:
                v, i = v / 1024, i + 1
            return f"{v:.4g}{suffixes[i]}"
        raise AssertionError(f"template action outside the checked subset: {{{{{body}}}}}")

    return _ACTION.sub(action, text)


@pytest.mark.parametrize("rule", alerts.rules(), ids=lambda r: r["uid"])
def test_summary_and_description_say_what_was_measured(rule: dict[str, Any]) -> None:
    reduces = [d["refId"] for d in rule["data"] if d["model"].get("type") == "reduce"]
    values = {ref: 1234.5 + i for i, ref in enumerate(reduces)}
    labels = {"host": "node-7", "gpu": "3", "run": "run-1", "rule": "data_loading"}
    for key in ("summary", "description"):
        text = rule["annotations"][key]
        assert re.search(_VALUE, text), f"{rule['uid']} {key} shows no measured value"
        assert set(re.findall(r'index \.Values "(\w+)"', text)) <= set(reduces), f"{rule['uid']}: unknown refId"
        rendered = render_template(text, labels, values)
        assert "node-7" in rendered and "{{" not in rendered
        assert re.search(r"\d", rendered)


def test_every_rule_links_its_runbook_and_panel() -> None:
    uids = {d.uid for d in dashboards()}
    for r in alerts.rules():
        ann = r["annotations"]
        assert ann["runbook_url"].startswith(f"/d/{alerts.RUNBOOK_UID}?viewPanel=panel-")
        assert ann["__dashboardUid__"] in uids and ann["__panelId__"].isdigit()


# -- contact points and the notification policy ----------------------------------------------------
def expand(value: str, env: dict[str, str], files: dict[str, str]) -> str:
    """Grafana's provisioning expansion (pkg/services/provisioning/values ``interpolateValue``).

    ``$$`` is a literal ``$``; in each part ``$__file{path}`` is replaced by the file's content,
    trimmed (setting.ExpandVar, an error if the file cannot be read), then ``$VAR``/``${VAR}`` by
    the environment (os.ExpandEnv: unset is empty).
    """

    def part(p: str) -> str:
        def file(m: re.Match[str]) -> str:
            if m.group(1) not in files:
                raise FileNotFoundError(m.group(1))
            return files[m.group(1)].strip()

        p = re.sub(r"\$__file\{([^}]*)\}", file, p)
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), p)

    return "$".join(part(p) for p in value.split("$$"))


def _compose_grafana(repo_root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Grafana's environment and mounted files as docker-compose.yml gives them with an untouched .env."""
    compose = yaml.safe_load((repo_root / "docker-compose.yml").read_text())
    svc = compose["services"]["grafana"]

    def default(v: str) -> str:
        return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", v)

    env = {k: default(str(v)) for k, v in svc["environment"].items()}
    files = {}
    for v in svc["volumes"]:
        if isinstance(v, str) and v.startswith("${"):
            source, target = default(v).split(":")[:2]
            files[target] = (repo_root / source).read_text()
    return env, files


def test_contact_points_are_valid_once_grafana_expands_them_with_the_stacks_defaults(repo_root: Path) -> None:
    env, files = _compose_grafana(repo_root)
    points = {cp["name"]: cp for cp in _doc(repo_root)["contactPoints"]}
    assert set(points) == {"gpulse-local", "gpulse-team"}
    for cp in points.values():
        for receiver in cp["receivers"]:
            kind = expand(receiver["type"], env, files)
            url = expand(receiver["settings"]["url"], env, files)
            assert kind in {"webhook", "slack"} and receiver["uid"], receiver
            assert re.fullmatch(r"https?://[\w.-]+(:\d+)?/\S*", url), (
                f"{cp['name']}: {url!r} (Grafana refuses to start)"
            )
    (local,) = points["gpulse-local"]["receivers"]
    assert local["settings"]["url"] == alerts.ALERT_LOG_URL + alerts.ALERT_LOG_PATH
    (team,) = points["gpulse-team"]["receivers"]
    assert expand(team["settings"]["url"], env, files) == alerts.ALERT_LOG_URL + alerts.UNCONFIGURED_PATH
    assert (repo_root / WEBHOOK_DEFAULT_PATH).read_text().strip() == alerts.ALERT_LOG_URL + alerts.UNCONFIGURED_PATH


def test_a_configured_slack_url_reaches_grafana_without_being_written_anywhere(repo_root: Path, tmp_path: Path) -> None:
    env, files = _compose_grafana(repo_root)
    env["GPULSE_ALERT_KIND"] = "slack"
    files[alerts.WEBHOOK_URL_PATH] = "https://hooks.slack.com/services/T000/B000/XXXX\n"
    (team,) = next(cp for cp in _doc(repo_root)["contactPoints"] if cp["name"] == "gpulse-team")["receivers"]
    assert expand(team["type"], env, files) == "slack"
    assert expand(team["settings"]["url"], env, files) == "https://hooks.slack.com/services/T000/B000/XXXX"
    assert "hooks.slack.com" not in (repo_root / ALERTS_PATH).read_text()
    with pytest.raises(FileNotFoundError):  # a missing file: Grafana stops; the compose default avoids it
        expand(team["settings"]["url"], env, {})


def test_the_expansion_stand_in_follows_grafanas_rules() -> None:
    assert expand("a $$b ${X} $Y", {"X": "1", "Y": "2"}, {}) == "a $b 1 2"
    assert expand("$UNSET-x", {}, {}) == "-x"
    assert expand("$__file{/f}", {}, {"/f": " v\n"}) == "v"


def test_the_policy_sends_every_gpulse_alert_to_both_contact_points(repo_root: Path) -> None:
    doc = _doc(repo_root)
    (policy,) = doc["policies"]
    names = {cp["name"] for cp in doc["contactPoints"]}
    assert policy["receiver"] in names
    routes = policy["routes"]
    for r in alerts.rules():
        matched = []
        for route in routes:
            if all(r["labels"].get(k) == v for k, op, v in route["object_matchers"] if op == "="):
                matched.append(route["receiver"])
                if not route.get("continue"):
                    break
        assert matched == ["gpulse-local", "gpulse-team"], r["uid"]
    assert {"alertname", "host"} <= set(policy["group_by"])
    assert _seconds(policy["repeat_interval"]) >= 3600


def test_the_compose_stack_runs_the_alert_log_service_grafana_posts_to(repo_root: Path) -> None:
    compose = yaml.safe_load((repo_root / "docker-compose.yml").read_text())
    svc = compose["services"]["alert-log"]
    assert svc["entrypoint"] == ["python", "-m", "gpulse.services.alert_receiver"]
    port = svc["command"][svc["command"].index("--port") + 1]
    assert alerts.ALERT_LOG_URL == f"http://alert-log:{port}"
    assert "ports" not in svc  # reachable only on the compose network
    assert os.path.basename(alerts.WEBHOOK_URL_PATH) == "webhook-url"
