"""Grafana unified alerting, file-provisioned: the rules, where notifications go, and each rule's runbook.

Rules. Each is InfluxQL queries grouped by ``host`` (and ``gpu``) so it alerts per GPU or per host,
then server-side expressions: ``reduce`` (last value of each series), optionally a ``math``
combination, and a ``threshold`` that is the rule's condition. Every rule waits ``for`` a while
before it fires, says in its summary and description what it measured (the reduce results, read
with ``index .Values "<refId>"`` in Grafana's templates), links its runbook, and names the panel
that shows it (``__dashboardUid__``/``__panelId__``), so the alert opens that panel.

Delivery. Without a contact point and a notification policy Grafana sends everything to its
default email contact point, which has no SMTP server here. So two contact points are provisioned:

* ``gpulse-local``: a webhook to the stack's own ``alert-log`` service
  (:mod:`gpulse.services.alert_receiver`), which works out of the box on a workstation and
  prints each alert with its summary (``docker compose logs alert-log``) and appends it to a file;
* ``gpulse-team``: a Slack or generic webhook whose kind comes from ``.env``
  (``GPULSE_ALERT_KIND``) and whose URL Grafana reads from a secret file
  (``GPULSE_ALERT_WEBHOOK_URL_FILE``, mounted at :data:`WEBHOOK_URL_PATH`). Until one is
  configured the file points back at the alert-log service's ``/unconfigured`` path, so Grafana's
  validation (which rejects an empty URL and would stop Grafana from starting) always passes.

The notification policy sends every gpulse alert to both.

Grafana expands ``$VAR`` and ``$__file{}`` in provisioned values (``pkg/services/provisioning/values``),
so annotation templates use ``.Labels``/``.Values`` and contain no ``$``; the contact points use
that expansion on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpulse.dashboards import agent_health, node, training
from gpulse.dashboards.builder import DATASOURCE_UID, Dashboard, panel_url, text

EXPR_UID = "__expr__"
FOLDER = "gpulse alerts"
GROUP = "gpulse"
INTERVAL = "1m"
RUNBOOK_UID = "gpulse-runbook"
#: Where the compose file mounts the secret file holding the team webhook URL.
WEBHOOK_URL_PATH = "/run/gpulse-alerting/webhook-url"
#: The alert-log service (docker-compose.yml) and the paths it answers.
ALERT_LOG_URL = "http://alert-log:9095"
ALERT_LOG_PATH = "/alert"
UNCONFIGURED_PATH = "/unconfigured"

Json = dict[str, Any]
GIB = 1024**3
GPU = '{{ index .Labels "host" }} GPU {{ index .Labels "gpu" }}'
HOST = '{{ index .Labels "host" }}'
RUN = '{{ index .Labels "run" }}'
RULE = '{{ index .Labels "rule" }}'


def value(ref: str, fmt: str = "%.0f") -> str:
    """A reduce result in a Grafana alert template, as a number."""
    return f'{{{{ printf "{fmt}" (index .Values "{ref}").Value }}}}'


def size(ref: str) -> str:
    """A reduce result in bytes, as Grafana's templates humanise it (1024-based)."""
    return f'{{{{ humanize1024 (index .Values "{ref}").Value }}}}B'


@dataclass(frozen=True)
class AlertQuery:
    ref_id: str
    sql: str
    window_s: int


@dataclass(frozen=True)
class AlertRule:
    """One alert rule, the panel that shows its data, and its runbook (markdown)."""

    uid: str
    title: str
    queries: tuple[AlertQuery, ...]
    exprs: tuple[Json, ...]
    summary: str
    description: str
    severity: str
    for_: str
    dashboard: Dashboard
    panel: str
    runbook: str
    no_data: str = "OK"
    panel_vars: dict[str, str] = field(default_factory=dict)


def _query(q: AlertQuery) -> Json:
    return {
        "refId": q.ref_id,
        "relativeTimeRange": {"from": q.window_s, "to": 0},
        "datasourceUid": DATASOURCE_UID,
        "model": {
            "refId": q.ref_id,
            "datasource": {"type": "influxdb", "uid": DATASOURCE_UID},
            "query": q.sql,
            "rawQuery": True,
            "resultFormat": "time_series",
            "intervalMs": 1000,
            "maxDataPoints": 43200,
        },
    }


def _expr(ref_id: str, model: Json) -> Json:
    return {
        "refId": ref_id,
        "relativeTimeRange": {"from": 0, "to": 0},
        "datasourceUid": EXPR_UID,
        "model": {"refId": ref_id, "datasource": {"type": "__expr__", "uid": EXPR_UID}, **model},
    }


def _reduce(ref_id: str, source: str) -> Json:
    return _expr(ref_id, {"type": "reduce", "expression": source, "reducer": "last", "settings": {"mode": "dropNN"}})


def _threshold(ref_id: str, source: str, op: str, limit: float) -> Json:
    return _expr(
        ref_id,
        {"type": "threshold", "expression": source, "conditions": [{"evaluator": {"type": op, "params": [limit]}}]},
    )


def _above(uid: str, title: str, sql: str, window_s: int, value_ref: str, limit: float, **kw: Any) -> AlertRule:
    """A rule on one query: its last value per series (``value_ref``) above ``limit``."""
    return AlertRule(
        uid,
        title,
        (AlertQuery("A", sql, window_s),),
        (_reduce(value_ref, "A"), _threshold("C", value_ref, "gt", limit)),
        **kw,
    )


def _catalogue() -> list[AlertRule]:
    nd, ah = node.build(), agent_health.build()
    by_gpu = 'WHERE $timeFilter GROUP BY "host", "gpu"'
    by_finding = 'WHERE $timeFilter GROUP BY "host", "run", "rule"'
    return [
        AlertRule(
            "gpulse-gpu-idle-memory",
            "GPU memory held while idle",
            (
                AlertQuery("A", f'SELECT mean("util_gpu_pct") FROM "gpu" {by_gpu}', 900),
                AlertQuery("B", f'SELECT min("mem_used_bytes") FROM "gpu" {by_gpu}', 900),
            ),
            (
                _reduce("busy", "A"),
                _reduce("memory", "B"),
                _expr("idle_holding", {"type": "math", "expression": f"$busy < 10 && $memory > {GIB}"}),
                _threshold("C", "idle_holding", "gt", 0),
            ),
            summary=f"{GPU} holds {size('memory')} but was {value('busy')} % busy",
            description=f"Over the last 15 minutes {GPU} was busy {value('busy', '%.1f')} % of the time on average "
            f"while at least {size('memory')} of its memory stayed allocated (alert below 10 % busy with more than "
            "1 GiB held): a stalled job, a notebook holding the GPU, or a hung process.",
            severity="warning",
            for_="15m",
            dashboard=nd,
            panel="Processes",
            runbook="A process keeps GPU memory allocated but launches almost no work, so nobody else can use the GPU.\n\n"
            "1. Open the Node dashboard's **Processes** panel for the host: it lists the process, its user, "
            "container and memory.\n"
            "2. Ask its owner, or check the job scheduler: a finished job whose process did not exit, a Jupyter "
            "kernel, a dataloader deadlock, or a rank waiting on a dead peer.\n"
            "3. If it is abandoned, stop it (`kill <pid>`, `docker stop <container>`); memory is freed when the "
            "process exits.",
        ),
        _above(
            "gpulse-gpu-throttled",
            "GPU throttled more than 20 % of the time",
            f'SELECT mean("throttled") * 100 FROM "gpu" {by_gpu}',
            900,
            "throttled",
            20,
            summary=f"{GPU} was throttled {value('throttled')} % of the last 15 minutes",
            description=f"{GPU} had its clocks held back by power, thermal, hardware-slowdown or sync-boost reasons "
            f"{value('throttled', '%.1f')} % of the time over the last 15 minutes (alert above 20 %).",
            severity="warning",
            for_="10m",
            dashboard=nd,
            panel="Throttle reasons (% of samples)",
            runbook="The GPU runs slower than it could.\n\n"
            "1. The Node dashboard's **Throttle reasons** panel says which reason: *software power cap* means "
            "the power limit (see **Power % of limit**); *thermal* means cooling (see **GPU temperature**, fans, "
            "inlet air); *hardware slowdown* or *power brake* come from the board or the PSU.\n"
            "2. Power capping under a full load is expected on some boards; thermal throttling is not: check "
            "airflow, blanking panels and the data-centre inlet temperature.\n"
            "3. `nvidia-smi -q -d PERFORMANCE` shows the same reasons on the host.",
        ),
        _above(
            "gpulse-gpu-hot",
            "GPU temperature above 85 °C",
            f'SELECT mean("temp_gpu_c") FROM "gpu" {by_gpu}',
            300,
            "temperature",
            85,
            summary=f"{GPU} runs at {value('temperature')} °C",
            description=f"{GPU} averaged {value('temperature', '%.1f')} °C over the last 5 minutes (alert above "
            "85 °C, where most data-centre GPUs start to slow down).",
            severity="warning",
            for_="5m",
            dashboard=nd,
            panel="GPU temperature and fan",
            runbook="The GPU is close to the temperature at which it slows itself down.\n\n"
            "1. Compare with the other GPUs of the host on the **GPU temperature and fan** panel: one hot GPU points at "
            "its slot or fan, all of them at the room or the chassis airflow.\n"
            "2. Check the fan line of the same panel and **Throttle reasons**: thermal throttling follows soon.\n"
            "3. Fix airflow (blanking panels, cable clutter, failed fans) before raising fan curves.",
        ),
        _above(
            "gpulse-gpu-xid",
            "GPU XID event",
            'SELECT count("xid") FROM "gpu_event" WHERE "kind" = \'xid\' AND $timeFilter GROUP BY "host", "gpu"',
            300,
            "xids",
            0,
            summary=f"{GPU} reported {value('xids')} XID error(s)",
            description=f"The driver reported {value('xids')} XID event(s) on {GPU} in the last 5 minutes; the "
            "GPU events table on the Node dashboard has the codes. Some XIDs need a GPU reset or a reboot.",
            severity="critical",
            for_="0s",
            dashboard=nd,
            panel="GPU events",
            runbook="The NVIDIA driver logged an XID error for this GPU.\n\n"
            "1. The Node dashboard's **GPU events** table has the XID code and text; the same lines are in "
            "`dmesg` / the kernel log (`NVRM: Xid`).\n"
            "2. Look the code up in NVIDIA's XID catalogue: 13/31/43 are usually the application (bad kernel, "
            "illegal address); 48/63/64/92/94/95 are memory (ECC) errors; 79 means the GPU fell off the bus.\n"
            "3. Memory and bus errors need the GPU drained, reset (`nvidia-smi -r`) or the node rebooted; "
            "repeated ones are an RMA case.",
        ),
        _above(
            "gpulse-gpu-ecc-uncorrected",
            "Uncorrected ECC errors",
            f'SELECT max("ecc_uncorrected_volatile") FROM "gpu" {by_gpu}',
            3600,
            "errors",
            0,
            summary=f"{GPU} has {value('errors')} uncorrected ECC error(s) since the driver loaded",
            description=f"{GPU} counted {value('errors')} uncorrected ECC error(s) since the driver last loaded: "
            "data on that GPU may have been corrupted and the job that used it should not be trusted.",
            severity="critical",
            for_="0s",
            dashboard=nd,
            panel="ECC errors since driver load",
            runbook="Uncorrectable memory errors happened on this GPU.\n\n"
            "1. Stop scheduling work on the GPU; jobs that ran on it may have produced wrong results.\n"
            "2. The Node dashboard's **Remapped rows and retired pages** shows whether the driver already "
            "remapped the failing rows (a pending remap needs a GPU reset to take effect).\n"
            "3. Reset the GPU (`nvidia-smi -r`) or reboot; if errors come back, or a row remap failed, "
            "the GPU needs replacing.",
        ),
        AlertRule(
            "gpulse-run-finding",
            "Training run finding open",
            (
                AlertQuery("A", f'SELECT last("open") FROM "train_finding" {by_finding}', 6 * 3600),
                AlertQuery("B", f'SELECT last("first_step") FROM "train_finding" {by_finding}', 6 * 3600),
            ),
            (_reduce("open", "A"), _reduce("since", "B"), _threshold("C", "open", "gt", 0)),
            summary=f"run {RUN} on {HOST}: {RULE} has held since step {value('since')}",
            description=f"The agent's rolling diagnosis raised {RULE} for run {RUN} on {HOST}: the rule of "
            f"docs/report.md has held over the run's recent steps since step {value('since')}, for a whole window "
            "at least. It resolves when the rule has failed for a whole window or the run ends.",
            severity="warning",
            for_="0s",
            dashboard=training.build(),
            panel=training.FINDINGS_PANEL,
            panel_vars={"run": RUN},
            runbook="A diagnosis rule holds while the run is going (the same rules as `metrics_report.json`).\n\n"
            "1. The Training run dashboard's **Findings while running** table has the evidence, with numbers, "
            "and the action; `gpulse status` on the node lists the open findings too.\n"
            "2. The rule's section in docs/report.md says what it measures and which threshold it crossed; "
            "the red annotations show when it was raised and cleared against the step time and its phases.\n"
            "3. Act on it (the action names the change: e.g. more DataLoader workers only with a free core, "
            "or the straggling rank's GPU and host); the finding clears by itself a window after the cause "
            "is gone.",
        ),
        AlertRule(
            "gpulse-agent-silent",
            "gpulse agent silent",
            (
                AlertQuery(
                    "A",
                    'SELECT moving_average(count("uptime_s"), 3) FROM "agent" WHERE $timeFilter GROUP BY time(1m), "host" fill(0)',
                    6 * 3600,
                ),
            ),
            (_reduce("recent", "A"), _threshold("C", "recent", "lt", 0.1)),
            summary=f"the gpulse agent on {HOST} sent {value('recent', '%.1f')} health points a minute (6 expected)",
            description=f"The agent on {HOST} sent {value('recent', '%.1f')} health points per minute over the last "
            "3 minutes (it sends 6): it stopped, the host is down, or it cannot reach InfluxDB. Hosts silent for "
            "more than 6 h drop out of this rule.",
            severity="critical",
            for_="1m",
            dashboard=ah,
            panel="Agents",
            runbook="No health point arrived from the agent on this host.\n\n"
            "1. The Agent health dashboard's **Agents** table shows when it last reported.\n"
            "2. On the host: `systemctl status gpulse-agent` (or `docker compose ps agent`); `gpulse status` "
            "shows whether it runs and whether its writes succeed.\n"
            "3. If it runs but cannot write, it spools to disk and replays once InfluxDB answers again: check "
            "the network and the token (`gpulse doctor`).",
        ),
        AlertRule(
            "gpulse-agent-spool-growing",
            "gpulse agent spool growing",
            (
                AlertQuery(
                    "A",
                    'SELECT last("spool_bytes") - first("spool_bytes") FROM "agent" WHERE $timeFilter GROUP BY "host"',
                    600,
                ),
                AlertQuery("B", 'SELECT min("spool_bytes") FROM "agent" WHERE $timeFilter GROUP BY "host"', 600),
            ),
            (
                _reduce("growth", "A"),
                _reduce("smallest", "B"),
                _expr("growing", {"type": "math", "expression": "$growth > 0 && $smallest > 0"}),
                _threshold("C", "growing", "gt", 0),
            ),
            summary=f"the gpulse agent on {HOST} has been spooling for 10 minutes ({size('growth')} more)",
            description=f"The disk spool on {HOST} was never empty in the last 10 minutes (at least "
            f"{size('smallest')}) and grew by {size('growth')}: InfluxDB is unreachable, rejects the token, or is "
            "too slow. Data is kept on disk and replayed once delivery recovers.",
            severity="warning",
            for_="5m",
            dashboard=ah,
            panel="Spool size",
            runbook="The agent cannot deliver as fast as it samples and keeps the rest on disk.\n\n"
            "1. The Agent health dashboard's **Write latency** and **Lines per second** show whether writes "
            "fail (nothing written) or are slow (latency up).\n"
            "2. `gpulse doctor` on the host checks the URL, the token and the bucket.\n"
            "3. Once InfluxDB accepts writes again the spool replays by itself; if the disk fills first, the "
            "oldest spooled lines are dropped (counted in **Lines per second** as dropped).",
        ),
    ]


def catalogue() -> list[AlertRule]:
    return _catalogue()


def runbook_dashboard(rules: list[AlertRule] | None = None) -> Dashboard:
    """One text panel per rule; each rule's ``runbook_url`` opens its panel."""
    d = Dashboard(
        RUNBOOK_UID,
        "gpulse / Alert runbooks",
        "Agent",
        "runbooks",
        "What each gpulse alert means and what to do about it (the same text as docs/dashboards.md).",
        time_from="now-6h",
        refresh="",
    )
    d.row(
        "Runbooks",
        *(
            text(r.title, f"Runbook of the alert rule {r.uid} ({r.severity}).", r.runbook, width=12, height=9)
            for r in (rules or catalogue())
        ),
    )
    return d


def runbook_url(rule: AlertRule) -> str:
    return panel_url(RUNBOOK_UID, runbook_dashboard().panel_id(rule.title))


def render(rule: AlertRule) -> Json:
    return {
        "uid": rule.uid,
        "title": rule.title,
        "condition": rule.exprs[-1]["refId"],
        "data": [_query(q) for q in rule.queries] + list(rule.exprs),
        "noDataState": rule.no_data,
        "execErrState": "Error",
        "for": rule.for_,
        "annotations": {
            "summary": rule.summary,
            "description": rule.description,
            "runbook_url": runbook_url(rule),
            "__dashboardUid__": rule.dashboard.uid,
            "__panelId__": str(rule.dashboard.panel_id(rule.panel)),
        },
        "labels": {"severity": rule.severity, "source": "gpulse"},
        "isPaused": False,
    }


def rules() -> list[Json]:
    return [render(r) for r in catalogue()]


def contact_points() -> list[Json]:
    return [
        {
            "orgId": 1,
            "name": "gpulse-local",
            "receivers": [
                {
                    "uid": "gpulse-local-log",
                    "type": "webhook",
                    "settings": {"url": ALERT_LOG_URL + ALERT_LOG_PATH, "httpMethod": "POST"},
                    "disableResolveMessage": False,
                }
            ],
        },
        {
            "orgId": 1,
            "name": "gpulse-team",
            "receivers": [
                {
                    "uid": "gpulse-team-webhook",
                    "type": "$GPULSE_ALERT_KIND",
                    "settings": {"url": f"$__file{{{WEBHOOK_URL_PATH}}}"},
                    "disableResolveMessage": False,
                }
            ],
        },
    ]


def policies() -> list[Json]:
    """One tree: every gpulse alert to the local log and (continuing) to the team contact point."""
    matcher = [["source", "=", "gpulse"]]
    return [
        {
            "orgId": 1,
            "receiver": "gpulse-local",
            "group_by": ["grafana_folder", "alertname", "host"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [
                {"receiver": "gpulse-local", "object_matchers": matcher, "continue": True},
                {"receiver": "gpulse-team", "object_matchers": matcher},
            ],
        }
    ]


def provisioning() -> Json:
    """The whole alerting provisioning document."""
    return {
        "apiVersion": 1,
        "contactPoints": contact_points(),
        "policies": policies(),
        "groups": [{"orgId": 1, "name": GROUP, "folder": FOLDER, "interval": INTERVAL, "rules": rules()}],
    }
