"""``docs/dashboards.md``: every dashboard's panels and what each one means, the alert rules and their runbooks."""

from __future__ import annotations

import re

from gpulse.dashboards import agent_health, alerts, history, tier_split
from gpulse.dashboards.alerts import AlertRule
from gpulse.dashboards.builder import Dashboard, Panel, Setting, Variable
from gpulse.dashboards.influxql import references


def _sources(queries: list[str]) -> str:
    seen: list[str] = []
    for q in queries:
        for rp, m in references(q).sources:
            name = f"`{m}`" if rp is None else f"`{m}` ({rp})"
            if name not in seen:
                seen.append(name)
    return ", ".join(seen)


def _units(p: Panel) -> str:
    units = [q.unit.id for q in p.queries if q.unit is not None] + [f"{c.name}: {c.unit.id}" for c in p.columns]
    return ", ".join(f"`{u}`" for u in dict.fromkeys(units))


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, spaces to dashes, punctuation dropped."""
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def _runbook(r: AlertRule) -> list[str]:
    return [
        f"### Runbook: {r.title}",
        "",
        f"Rule `{r.uid}`, {r.severity}, fires after `{r.for_}`; opens **{r.panel}** on {r.dashboard.title}.",
        "",
        r.runbook,
        "",
    ]


def _variable(v: Variable | Setting) -> str:
    if isinstance(v, Setting):
        return f"`${v.name}` (hidden setting, default `{v.default}`)"
    return f"`${v.name}` (`{v.query}`)"


def render_markdown(dashboards: list[Dashboard], rules: list[AlertRule]) -> str:
    out = [
        "# gpulse dashboards and alerts",
        "",
        "Generated from `agent/src/gpulse/dashboards/` by `python -m gpulse.dashboards` (`make generate`); a test fails "
        "when this file or the JSON under `grafana/` differs from the generator.",
        "",
        "All queries are raw InfluxQL against the datasource `gpulse-influxql`. Field names are those of "
        "[the data model](schema.md).",
        "",
        "## Choices the dashboards make",
        "",
        "- **Database name.** The InfluxQL database is the raw bucket's name, `GPULSE_BUCKET` in `.env` "
        "(`gpulse` by default): `gpulse setup` maps it (retention policies `raw` (default), `1m`, `1h`) and "
        "Grafana's datasource reads the same variable (`dbName: $GPULSE_BUCKET`). Queries never name the "
        'database, only a retention policy (`FROM "1h"."gpu"`), so any bucket name works.',
        "- **Time zone.** Live dashboards use the browser's time zone. History groups by InfluxQL's "
        "`time(1d)`, whose days start at midnight UTC, so History is in UTC and says so.",
        "- **Latest run.** The Training run dashboard's `$run` lists the runs of the time range, "
        "the latest first, and opens on it.",
        "- **Old runs.** Every Training run panel reads the raw tier where raw retention still holds the range "
        "and the `1m` tier before it (two targets split at `now() - $raw_retention`), so a run months old opens "
        "at 1-minute resolution. `$raw_retention` is a hidden setting: a stack that keeps raw points other than "
        f"{tier_split.RAW_RETENTION_SETTING.default} opens the dashboard with `var-raw_retention=<duration>`.",
        "- **Tiers are datasources.** Each query goes to its tier's datasource (`gpulse-influxql`, "
        "`gpulse-influxql-1m`, `gpulse-influxql-1h`) and names the tier's retention policy: on InfluxDB 2.x both "
        "point at the same tier, on InfluxDB 3 (which ignores the retention policy) the datasource's database does.",
        "- **Bounded.** Every query, variable and annotation names a time range: InfluxDB 3 Core refuses a query "
        "over more Parquet files than its limit, and its `SHOW TAG VALUES` sees one day without one.",
        f"- **Dead hosts.** Agent health's liveness panels look back {agent_health.LIVENESS_WINDOW} whatever the "
        "time picker says, so a host whose agent died stays listed, in red, instead of vanishing.",
        "- **Data that outlives the raw tier.** `gpu_info` is written at agent start and again every hour, so "
        f"the inventory and PCIe maximums stay within the raw retention; History reads only `{history.HOURLY}` "
        f"and `{history.MINUTE}`, including its `$host` list.",
        "- **Units.** Every query and table column carries its own unit (pids as digits, memory in KiB/MiB/GiB, "
        "clocks in MHz/GHz, ratios as %, GPU-hours as GPU-h); the tests format a value of each with Grafana's "
        "own formatter.",
        "",
    ]
    for d in dashboards:
        out += [f"## {d.title}", "", d.description, ""]
        out += [f"File `grafana/dashboards/{d.path}`, uid `{d.uid}`, default range `{d.time_from}` to now, "]
        out[-1] += f"time zone `{d.timezone}`."
        out.append("")
        if d.variables:
            out.append("Variables: " + ", ".join(_variable(v) for v in d.variables) + ".")
            out.append("")
        for a in d.annotations:
            out.append(f"Annotation **{a.name}**: `{a.query}`")
            out.append("")
        out += ["| row | panel | type | what it shows | units | data |", "| --- | --- | --- | --- | --- | --- |"]
        for row, panels in d.rows:
            for p in panels:
                src = _sources([q.sql for q in p.queries])
                out.append(f"| {row} | **{p.title}** | {p.type} | {p.description} | {_units(p)} | {src} |")
        out.append("")
    out += [
        "## Alert rules",
        "",
        f"Provisioned from `grafana/provisioning/alerting/gpulse.yaml` (Grafana unified alerting), evaluated every "
        f"{alerts.INTERVAL}; each fires per GPU or per host, opens the panel that shows it, and links its runbook "
        "(below, and as the Grafana dashboard *gpulse / Alert runbooks*).",
        "",
        "| rule | summary | waits | severity | panel |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rules:
        out.append(
            f"| **{r.title}** ([runbook](#{anchor('Runbook: ' + r.title)})) | {r.summary} | `{r.for_}` | "
            f"{r.severity} | {r.dashboard.title} / {r.panel} |"
        )
    out += [
        "",
        "### Where notifications go",
        "",
        "Every gpulse alert goes to two provisioned contact points:",
        "",
        "- `gpulse-local`: a webhook to the stack's `alert-log` service, which prints each alert "
        "(`docker compose logs -f alert-log`). Works with nothing to configure.",
        "- `gpulse-team`: Slack or any webhook. Put the URL in a file (e.g. `secrets/alert-webhook-url`, mode 0600), "
        "set `GPULSE_ALERT_WEBHOOK_URL_FILE=./secrets/alert-webhook-url` and, for Slack, `GPULSE_ALERT_KIND=slack` "
        "in `.env`, then run `make up` again. Until then it points at the alert-log service, which ignores it.",
        "",
    ]
    for r in rules:
        out += _runbook(r)
    return "\n".join(out)
