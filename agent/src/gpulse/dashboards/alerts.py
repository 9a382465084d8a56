"""Grafana unified-alerting rules, in the file-provisioning format (``apiVersion: 1``, ``groups``).

Each rule is InfluxQL queries grouped by ``host`` (and ``gpu``) so it alerts per GPU or per host,
then server-side expressions: ``reduce`` (last value of each series), optionally a ``math``
combination, and a ``threshold`` that is the rule's condition.

Grafana interpolates ``$VAR`` in provisioned strings such as annotations (but not in query
models), so the annotation templates use ``{{ index .Labels "host" }}`` and contain no ``$``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpulse.dashboards.builder import DATASOURCE_UID

EXPR_UID = "__expr__"
FOLDER = "gpulse alerts"
GROUP = "gpulse"
INTERVAL = "1m"

Json = dict[str, Any]


@dataclass(frozen=True)
class AlertQuery:
    ref_id: str
    sql: str
    window_s: int


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


def _threshold(ref_id: str, source: str, op: str, value: float) -> Json:
    return _expr(
        ref_id,
        {"type": "threshold", "expression": source, "conditions": [{"evaluator": {"type": op, "params": [value]}}]},
    )


def _rule(
    uid: str,
    title: str,
    queries: list[AlertQuery],
    exprs: list[Json],
    *,
    summary: str,
    description: str,
    severity: str,
    for_: str = "0s",
    no_data: str = "OK",
) -> Json:
    return {
        "uid": uid,
        "title": title,
        "condition": exprs[-1]["refId"],
        "data": [_query(q) for q in queries] + exprs,
        "noDataState": no_data,
        "execErrState": "Error",
        "for": for_,
        "annotations": {"summary": summary, "description": description},
        "labels": {"severity": severity, "source": "gpulse"},
        "isPaused": False,
    }


GIB = 1024**3


def rules() -> list[Json]:
    where = 'WHERE $timeFilter GROUP BY "host", "gpu"'
    gpu = '{{ index .Labels "host" }} GPU {{ index .Labels "gpu" }}'
    host = '{{ index .Labels "host" }}'
    return [
        _rule(
            "gpulse-gpu-idle-memory",
            "GPU memory held while idle",
            [
                AlertQuery("A", f'SELECT mean("util_gpu_pct") FROM "gpu" {where}', 900),
                AlertQuery("B", f'SELECT min("mem_used_bytes") FROM "gpu" {where}', 900),
            ],
            [
                _reduce("busy", "A"),
                _reduce("memory", "B"),
                _expr("idle_holding", {"type": "math", "expression": f"$busy < 10 && $memory > {GIB}"}),
                _threshold("C", "idle_holding", "gt", 0),
            ],
            summary=f"{gpu} holds memory but is almost idle",
            description="For 15 minutes the GPU was busy less than 10 % of the time while more than 1 GiB of its memory "
            "stayed allocated: a stalled job, a notebook holding the GPU, or a hung process.",
            severity="warning",
        ),
        _rule(
            "gpulse-gpu-throttled",
            "GPU throttled more than 20 % of the time",
            [AlertQuery("A", f'SELECT mean("throttled") * 100 FROM "gpu" {where}', 900)],
            [_reduce("throttled", "A"), _threshold("C", "throttled", "gt", 20)],
            summary=f"{gpu} was throttled more than 20 % of the last 15 minutes",
            description="Power, thermal, hardware-slowdown or sync-boost reasons held the clocks back; check cooling, "
            "power limits and the Node dashboard's throttle-reasons panel.",
            severity="warning",
        ),
        _rule(
            "gpulse-gpu-xid",
            "GPU XID event",
            [
                AlertQuery(
                    "A",
                    'SELECT count("xid") FROM "gpu_event" WHERE "kind" = \'xid\' AND $timeFilter GROUP BY "host", "gpu"',
                    300,
                )
            ],
            [_reduce("xids", "A"), _threshold("C", "xids", "gt", 0)],
            summary=f"{gpu} reported an XID error",
            description="The driver reported an XID event (see the Node dashboard's GPU events); some XIDs need a GPU reset or a reboot.",
            severity="critical",
        ),
        _rule(
            "gpulse-agent-silent",
            "gpulse agent silent",
            [
                AlertQuery(
                    "A",
                    'SELECT moving_average(count("uptime_s"), 3) FROM "agent" WHERE $timeFilter GROUP BY time(1m), "host" fill(0)',
                    6 * 3600,
                )
            ],
            [_reduce("recent", "A"), _threshold("C", "recent", "lt", 0.1)],
            summary=f"the gpulse agent on {host} has sent nothing for 2 minutes",
            description="No health point from this host's agent in the last 2-3 minutes (it writes one every 10 s): "
            "the agent stopped, the host is down, or it cannot reach InfluxDB. Hosts silent for more than 6 h drop out.",
            severity="critical",
        ),
        _rule(
            "gpulse-agent-spool-growing",
            "gpulse agent spool growing",
            [
                AlertQuery(
                    "A",
                    'SELECT last("spool_bytes") - first("spool_bytes") FROM "agent" WHERE $timeFilter GROUP BY "host"',
                    600,
                ),
                AlertQuery("B", 'SELECT min("spool_bytes") FROM "agent" WHERE $timeFilter GROUP BY "host"', 600),
            ],
            [
                _reduce("growth", "A"),
                _reduce("smallest", "B"),
                _expr("growing", {"type": "math", "expression": "$growth > 0 && $smallest > 0"}),
                _threshold("C", "growing", "gt", 0),
            ],
            summary=f"the gpulse agent on {host} has been spooling for 10 minutes",
            description="The disk spool was never empty in the last 10 minutes and grew: InfluxDB is unreachable, "
            "rejects the token, or is too slow. Data is kept on disk and replayed once delivery recovers.",
            severity="warning",
        ),
    ]


def provisioning() -> Json:
    """The whole alerting provisioning document."""
    return {
        "apiVersion": 1,
        "groups": [{"orgId": 1, "name": GROUP, "folder": FOLDER, "interval": INTERVAL, "rules": rules()}],
    }
