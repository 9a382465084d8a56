"""The checks of `make e2e` (scripts/e2e.sh), against a running stack, through the HTTP APIs only.

1. InfluxDB: the simulated GPUs' points arrived (InfluxQL through the DBRP mapping, as Grafana reads).
2. The downsampling tasks exist, are active, and a run of each succeeds; the 1m bucket then has points.
3. Grafana: healthy, the datasource works, every dashboard JSON under grafana/dashboards is provisioned,
   and each panel's queries (template variables resolved through Grafana, as the UI would) return data.
Prints one line per dashboard with how many panels returned data; exits 1 on any failure.
The queries are substituted by the tests' stand-in for Grafana's (``agent/tests/support/
grafana_interpolate.py``; ``scripts/e2e.sh`` puts ``agent/tests`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from support.grafana_interpolate import Selection, interpolate

from gpulse.influx.downsample import TIERS, task_name

RANGE = "now-3h"


def http(method: str, url: str, headers: dict[str, str], body: Any = None, form: dict[str, str] | None = None) -> Any:
    data = None
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        headers = headers | {"Content-Type": "application/x-www-form-urlencoded"}
    elif body is not None:
        data = json.dumps(body).encode()
        headers = headers | {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, headers=headers | {"Accept": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {url}: HTTP {e.code}: {e.read()[:500]!r}") from None
    return json.loads(raw) if raw.strip() else None


def check_influx(url: str, token: str) -> None:
    auth = {"Authorization": f"Token {token}"}
    q = 'SELECT count("util_gpu_pct") FROM "gpulse"."raw"."gpu" WHERE time > now() - 10m'
    res = http("POST", f"{url}/query", auth, form={"db": "gpulse", "q": q})
    series = res["results"][0].get("series") or []
    n = series[0]["values"][0][1] if series else 0
    print(f"influxdb: {n} util_gpu_pct points in the last 10 min")
    if not n:
        raise SystemExit("no GPU data arrived in InfluxDB")
    org_id = http("GET", f"{url}/api/v2/orgs?org=gpulse", auth)["orgs"][0]["id"]
    for tier in TIERS:
        name = task_name(tier)
        tasks = http("GET", f"{url}/api/v2/tasks?name={name}&orgID={org_id}", auth)["tasks"]
        if len(tasks) != 1 or tasks[0]["status"] != "active":
            raise SystemExit(f"task {name}: expected one active task, found {tasks}")
        run = http("POST", f"{url}/api/v2/tasks/{tasks[0]['id']}/runs", auth, body={})
        for _ in range(120):
            run = http("GET", f"{url}/api/v2/tasks/{tasks[0]['id']}/runs/{run['id']}", auth)
            if run["status"] in ("success", "failed", "canceled"):
                break
            time.sleep(1)
        if run["status"] != "success":
            logs = http("GET", f"{url}/api/v2/tasks/{tasks[0]['id']}/runs/{run['id']}/logs", auth)
            raise SystemExit(f"task {name} run {run['status']}: {logs}")
        print(f"task {name}: run succeeded")
    q = 'SELECT count("util_gpu_pct") FROM "gpulse"."1m"."gpu" WHERE time > now() - 1h'
    series = http("POST", f"{url}/query", auth, form={"db": "gpulse", "q": q})["results"][0].get("series") or []
    if not series:
        raise SystemExit("the 1m tier is empty after the task ran")
    print(f"influxdb: {series[0]['values'][0][1]} points in gpulse/1m after the task run")


class Grafana:
    def __init__(self, url: str, password: str) -> None:
        self.url = url
        raw = base64.b64encode(f"admin:{password}".encode()).decode()
        self.auth = {"Authorization": f"Basic {raw}"}

    def get(self, path: str) -> Any:
        return http("GET", self.url + path, self.auth)

    def query(self, ds_uid: str, q: str) -> list[dict]:
        body = {
            "from": RANGE,
            "to": "now",
            "queries": [
                {
                    "refId": "A",
                    "datasource": {"uid": ds_uid},
                    "query": q,
                    "rawQuery": True,
                    "resultFormat": "time_series",
                    "intervalMs": 10000,
                    "maxDataPoints": 500,
                }
            ],
        }
        res = http("POST", self.url + "/api/ds/query", self.auth, body=body)["results"]["A"]
        if res.get("error"):
            raise RuntimeError(res["error"])
        return [f for f in res.get("frames", []) if any(len(v) for v in f.get("data", {}).get("values", []))]


def frame_values(frames: list[dict]) -> list[str]:
    """Variable values: the last text column of each frame (SHOW TAG VALUES answers key, value)."""
    out = []
    for f in frames:
        text_columns = [vals for vals in f["data"]["values"] if vals and all(isinstance(v, str) for v in vals)]
        if text_columns:
            out += text_columns[-1]
    return out


def panels(items: list[dict]) -> list[dict]:
    out = []
    for p in items:
        out.append(p)
        out += panels(p.get("panels", []))
    return [p for p in out if p.get("targets")]


def check_dashboard(grafana: Grafana, path: Path, ds_default: str) -> tuple[int, int, list[str]]:
    doc = json.loads(path.read_text())
    grafana.get(f"/api/dashboards/uid/{doc['uid']}")  # provisioned
    variables: dict[str, Selection] = {}
    for v in doc.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
            frames = grafana.query(
                (v.get("datasource") or {}).get("uid", ds_default), interpolate(q, variables, time_from=RANGE)
            )
            values = tuple(dict.fromkeys(frame_values(frames))) or ("",)
        elif v.get("type") == "custom":
            values = tuple(o["value"] for o in v.get("options", [])) or (str(v.get("current", {}).get("value", "")),)
        else:
            cur = v.get("current", {}).get("value", "")
            values = tuple(cur) if isinstance(cur, list) else (str(cur),)
        variables[v["name"]] = Selection(values=values, multi=True)
    total, with_data, empty = 0, 0, []
    for p in panels(doc.get("panels", [])):
        total += 1
        got = False
        for t in p["targets"]:
            uid = (t.get("datasource") or p.get("datasource") or {}).get("uid", ds_default)
            if t.get("query") and uid != "__expr__":
                got |= bool(grafana.query(uid, interpolate(t["query"], variables, time_from=RANGE)))
        with_data += got
        if not got:
            empty.append(p.get("title", "?"))
    return total, with_data, empty


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--influx", required=True)
    ap.add_argument("--grafana", required=True)
    ap.add_argument("--secrets", required=True, type=Path)
    ap.add_argument("--dashboards", required=True, type=Path)
    a = ap.parse_args()
    check_influx(a.influx, (a.secrets / "influxdb-admin-token").read_text().strip())
    grafana = Grafana(a.grafana, (a.secrets / "grafana-admin-password").read_text().strip())
    if grafana.get("/api/health").get("database") != "ok":
        raise SystemExit("grafana is not healthy")
    sources = grafana.get("/api/datasources")
    ds_default = next(d["uid"] for d in sources if d.get("isDefault"))
    failed = False
    for path in sorted(a.dashboards.rglob("*.json")):
        total, with_data, empty = check_dashboard(grafana, path, ds_default)
        print(f"grafana: {path.relative_to(a.dashboards)}: {with_data}/{total} panels returned data"
              + (f"; empty: {', '.join(empty)}" if empty else ""))  # fmt: skip
        failed |= bool(empty)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
