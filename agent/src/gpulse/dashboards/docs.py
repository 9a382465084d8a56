"""``docs/dashboards.md``: every dashboard's panels and what each one means, plus the alert rules."""

from __future__ import annotations

from typing import Any

from gpulse.dashboards.builder import Dashboard
from gpulse.dashboards.influxql import references


def _sources(queries: list[str]) -> str:
    seen: list[str] = []
    for q in queries:
        for rp, m in references(q).sources:
            name = f"`{m}`" if rp is None else f"`{m}` ({rp})"
            if name not in seen:
                seen.append(name)
    return ", ".join(seen)


def render_markdown(dashboards: list[Dashboard], rules: list[dict[str, Any]]) -> str:
    out = [
        "# gpulse dashboards and alerts",
        "",
        "Generated from `agent/src/gpulse/dashboards/` by `python -m gpulse.dashboards` (`make generate`); a test fails "
        "when this file or the JSON under `grafana/dashboards/` differs from the generator.",
        "",
        "All queries are raw InfluxQL against the datasource `gpulse-influxql` (database `gpulse`; retention policies "
        "`raw` (default), `1m` and `1h`). Field names are those of [the data model](schema.md).",
        "",
    ]
    for d in dashboards:
        out += [f"## {d.title}", "", d.description, ""]
        out += [f"File `grafana/dashboards/{d.path}`, uid `{d.uid}`, default range `{d.time_from}` to now.", ""]
        if d.variables:
            out.append("Variables: " + ", ".join(f"`${v['name']}` ({v['query']})" for v in d.variables) + ".")
            out.append("")
        for a in d.annotations:
            out.append(f"Annotation **{a['name']}**: `{a['query']}`")
            out.append("")
        out += ["| row | panel | type | what it shows | data |", "| --- | --- | --- | --- | --- |"]
        for row, panels in d.rows:
            for p in panels:
                src = _sources([q.sql for q in p.queries])
                out.append(f"| {row} | **{p.title}** | {p.type} | {p.description} | {src} |")
        out.append("")
    out += [
        "## Alert rules",
        "",
        "Provisioned from `grafana/provisioning/alerting/gpulse.yaml` (Grafana unified alerting), evaluated every minute; "
        "each fires per GPU or per host.",
        "",
        "| rule | condition | severity |",
        "| --- | --- | --- |",
    ]
    for r in rules:
        out.append(f"| **{r['title']}** | {r['annotations']['description']} | {r['labels']['severity']} |")
    out.append("")
    return "\n".join(out)
