"""The alert-log service: Grafana's webhook notifications, posted over real HTTP, become one readable line each."""

from __future__ import annotations

import io
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulse.dashboards import alerts
from gpulse.services import alert_receiver

#: A notification as Grafana's webhook contact point posts it (grafana/alerting receivers/webhook:
#: the Alertmanager-style body plus Grafana's title/state/message and per-alert URLs and values).
NOTIFICATION = {
    "receiver": "gpulse-local",
    "status": "firing",
    "orgId": 1,
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "GPU temperature above 85 °C", "host": "node-7", "gpu": "3", "severity": "warning"},
            "annotations": {"summary": "node-7 GPU 3 runs at 91 °C", "description": "..."},
            "startsAt": "2026-09-01T10:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://grafana:3000/alerting/grafana/gpulse-gpu-hot/view",
            "fingerprint": "a1b2",
            "silenceURL": "http://grafana:3000/alerting/silence/new",
            "dashboardURL": "http://grafana:3000/d/gpulse-node",
            "panelURL": "http://grafana:3000/d/gpulse-node?viewPanel=22",
            "values": {"temperature": 91.2, "C": 1},
            "valueString": "[ var='temperature' value=91.2 ]",
        }
    ],
    "groupLabels": {"alertname": "GPU temperature above 85 °C"},
    "commonLabels": {},
    "commonAnnotations": {},
    "externalURL": "http://grafana:3000/",
    "version": "1",
    "groupKey": "{}:{}",
    "truncatedAlerts": 0,
    "title": "[FIRING:1] GPU temperature above 85 °C",
    "state": "alerting",
    "message": "...",
}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[dict[str, Any]]:
    out = io.StringIO()
    log = alert_receiver.AlertLog(out, tmp_path / "alerts.jsonl")
    server = alert_receiver.serve("127.0.0.1", 0, log)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"url": f"http://127.0.0.1:{server.server_address[1]}", "out": out, "file": tmp_path / "alerts.jsonl"}
    finally:
        server.shutdown()
        server.server_close()


def _post(url: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_grafana_notification_becomes_one_line_per_alert_with_its_summary_and_panel(service: dict[str, Any]) -> None:
    status, text = _post(service["url"] + alerts.ALERT_LOG_PATH, json.dumps(NOTIFICATION).encode())
    assert (status, text) == (200, "1 alert(s) logged\n")
    (line,) = service["out"].getvalue().splitlines()
    assert line == (
        "2026-09-01T10:00:00Z FIRING [warning] GPU temperature above 85 °C: node-7 GPU 3 runs at 91 °C "
        "http://grafana:3000/d/gpulse-node?viewPanel=22"
    )
    (stored,) = [json.loads(x) for x in service["file"].read_text().splitlines()]
    assert stored["summary"] == "node-7 GPU 3 runs at 91 °C" and stored["status"] == "firing"


def test_the_unconfigured_team_contact_point_is_accepted_and_explained_once(service: dict[str, Any]) -> None:
    for _ in range(3):
        assert _post(service["url"] + alerts.UNCONFIGURED_PATH, json.dumps(NOTIFICATION).encode())[0] == 204
    assert service["out"].getvalue().splitlines() == [alert_receiver.CONFIGURE_HINT]
    assert not service["file"].exists()


@pytest.mark.parametrize(
    ("body", "why"),
    [(b"not json", "body is not JSON"), (b'{"alerts": 3}', "no alerts list"), (b"[]", "no alerts list")],
)
def test_bad_input_gets_a_400_that_says_why_and_the_service_keeps_running(
    service: dict[str, Any], body: bytes, why: str
) -> None:
    status, text = _post(service["url"] + alerts.ALERT_LOG_PATH, body)
    assert status == 400 and why in text
    assert _post(service["url"] + alerts.ALERT_LOG_PATH, json.dumps(NOTIFICATION).encode())[0] == 200


def test_health_answers_for_the_compose_healthcheck_and_other_paths_are_not_found(service: dict[str, Any]) -> None:
    with urllib.request.urlopen(service["url"] + "/health", timeout=10) as r:
        assert r.status == 200
    assert _post(service["url"] + "/elsewhere", b"{}")[0] == 404


def test_the_command_line_listens_where_it_is_told(tmp_path: Path) -> None:
    started: list[Any] = []
    thread = threading.Thread(
        target=alert_receiver.main, args=(["--port", "0", "--file", str(tmp_path / "a.jsonl")],),
        kwargs={"started": started.append}, daemon=True,
    )  # fmt: skip
    thread.start()
    for _ in range(100):
        if started:
            break
        threading.Event().wait(0.05)
    (server,) = started
    try:
        assert server.server_address[0] == "127.0.0.1"  # loopback unless --bind says otherwise
    finally:
        server.shutdown()
    thread.join(10)
