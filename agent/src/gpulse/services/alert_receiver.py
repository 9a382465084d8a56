"""``python -m gpulse.services.alert_receiver``: the stack's own alert contact point (service ``alert-log``).

Grafana's provisioned contact point ``gpulse-local`` posts its webhook here, so an alert reaches
somebody on a workstation with nothing to configure: each one is printed as one line (read them
with ``docker compose logs -f alert-log``) and, with ``--file``, appended to a file as JSON.

The body is Grafana's webhook payload (grafana/alerting ``receivers/webhook``: ``status``,
``alerts[]`` with ``status``, ``labels``, ``annotations``, ``startsAt``, ``panelURL``,
``dashboardURL``, ``generatorURL``, ...). ``POST /unconfigured`` is where the ``gpulse-team``
contact point points until a Slack or webhook URL is configured; it is answered and ignored,
with one hint on how to configure it. Bad input gets a 400 and a message, never a crash.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

from gpulse.dashboards.alerts import ALERT_LOG_PATH, UNCONFIGURED_PATH

MAX_BODY = 1 << 20
CONFIGURE_HINT = (
    "the gpulse-team contact point is not configured: put a Slack or webhook URL in a secret file, set "
    "GPULSE_ALERT_WEBHOOK_URL_FILE (and GPULSE_ALERT_KIND=slack for Slack) in .env, then run `make up` again"
)


@dataclass(frozen=True)
class Alert:
    """One alert of a notification, as a person reads it."""

    status: str
    name: str
    severity: str
    summary: str
    starts_at: str
    link: str

    @classmethod
    def from_payload(cls, a: dict[str, Any]) -> Alert:
        labels = a.get("labels") or {}
        annotations = a.get("annotations") or {}
        return cls(
            status=str(a.get("status", "?")),
            name=str(labels.get("alertname", "?")),
            severity=str(labels.get("severity", "")),
            summary=str(annotations.get("summary") or annotations.get("description") or ""),
            starts_at=str(a.get("startsAt", "")),
            link=str(a.get("panelURL") or a.get("dashboardURL") or a.get("generatorURL") or ""),
        )

    def line(self) -> str:
        severity = f" [{self.severity}]" if self.severity else ""
        link = f" {self.link}" if self.link else ""
        return f"{self.starts_at} {self.status.upper()}{severity} {self.name}: {self.summary}{link}"


def parse(body: bytes) -> list[Alert]:
    """The alerts of one Grafana webhook notification; ``ValueError`` says what is wrong with the body."""
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise ValueError(f"body is not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("alerts"), list):
        raise ValueError("body is not a Grafana webhook notification (no alerts list)")
    return [Alert.from_payload(a) for a in doc["alerts"] if isinstance(a, dict)]


class AlertLog:
    """Where received alerts go: one line each on ``out``, and JSON lines in ``file`` when given."""

    def __init__(self, out: TextIO, file: Path | None = None) -> None:
        self.out = out
        self.file = file
        self.lock = threading.Lock()
        self.hinted = False

    def record(self, alerts: list[Alert]) -> None:
        with self.lock:
            for a in alerts:
                print(a.line(), file=self.out, flush=True)
            if self.file is not None and alerts:
                with self.file.open("a", encoding="utf-8") as f:
                    for a in alerts:
                        f.write(json.dumps(a.__dict__, ensure_ascii=False) + "\n")

    def unconfigured(self) -> None:
        with self.lock:
            if not self.hinted:
                self.hinted = True
                print(CONFIGURE_HINT, file=self.out, flush=True)


def handler(log: AlertLog) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpulse-alert-log"

        def _answer(self, code: int, text: str = "") -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(200, "ok\n") if self.path == "/health" else self._answer(404, "not found\n")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._answer(413, f"body larger than {MAX_BODY} bytes\n")
                return
            body = self.rfile.read(length)
            if self.path == UNCONFIGURED_PATH:
                log.unconfigured()
                self._answer(204)
                return
            if self.path != ALERT_LOG_PATH:
                self._answer(404, f"post alerts to {ALERT_LOG_PATH}\n")
                return
            try:
                alerts = parse(body)
            except ValueError as e:
                self._answer(400, f"{e}\n")
                return
            log.record(alerts)
            self._answer(200, f"{len(alerts)} alert(s) logged\n")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def serve(bind: str, port: int, log: AlertLog) -> ThreadingHTTPServer:
    return ThreadingHTTPServer((bind, port), handler(log))


def main(argv: list[str] | None = None, *, started: Callable[[ThreadingHTTPServer], None] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulse.services.alert_receiver", description=__doc__.split("\n")[0])
    p.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9095, help="port (default 9095)")
    p.add_argument("--file", type=Path, help="also append each alert to this file as a JSON line")
    args = p.parse_args(argv)
    server = serve(args.bind, args.port, AlertLog(sys.stdout, args.file))
    print(f"gpulse alert log: listening on {args.bind}:{server.server_address[1]}", flush=True)
    if started is not None:
        started(server)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
