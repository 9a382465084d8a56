"""InfluxQL over HTTP, for both APIs: what setup (v1), report, doctor and demo read and run.

InfluxDB 1.x serves ``/query`` natively; InfluxDB 2.x serves the same endpoint through its DBRP
mappings (``gpulse setup`` creates them), with ``Authorization: Token``. One small client covers
both, so every command reads the database the same way Grafana's InfluxQL datasource does.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from gpulse.influx.connection import ConfigError, Connection
from gpulse.influx.http import TransportError
from gpulse.influx.server import Diagnosis, Explainer

#: a query's total deadline (a run's report reads every step and GPU sample of the run)
QUERY_TIMEOUT_S = 120.0
#: the largest answer read (a week of 8 GPUs sampled every second is hundreds of MB of JSON)
QUERY_MAX_BODY = 1 << 30


class QueryError(Exception):
    """The server answered, but not with results (bad query, missing database, auth), or did not answer.

    ``diagnosis`` says what kind of problem it is (wrong --api, credentials, layout) and the fix, when known."""

    def __init__(self, message: str, status: int | None = None, diagnosis: Diagnosis | None = None) -> None:
        text = f"HTTP {status}: {message}" if status else message
        super().__init__(diagnosis.explain(text) if diagnosis is not None else text)
        #: the server's own words (or why it did not answer)
        self.message = message
        self.status = status
        self.diagnosis = diagnosis


class InfluxQL:
    def __init__(self, conn: Connection, timeout: float | None = None) -> None:
        if not conn.url:
            raise ConfigError("this command needs --url")
        self.conn = conn
        self.timeout = timeout or max(conn.timeout_s, QUERY_TIMEOUT_S)
        self.http = conn.http_client(timeout_s=self.timeout, max_body=QUERY_MAX_BODY)
        self.explainer = Explainer(conn)

    def raw(self, q: str, db: str | None = None, epoch: str = "ns") -> dict[str, Any]:
        """POST ``/query`` and return the decoded JSON; raise :class:`QueryError` on any error.

        No ``org`` parameter: InfluxDB 2.x takes the org from the token and ignores it."""
        params = {"q": q, "epoch": epoch}
        database = db if db is not None else self.conn.database
        if database:
            params["db"] = database
        try:
            r = self.http.request(
                "POST",
                "/query",
                body=urllib.parse.urlencode(params).encode(),
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
        except TransportError as e:
            raise QueryError(e.describe()) from None
        if not r.ok:
            message = r.message()
            raise QueryError(message, r.status, self.explainer.diagnose(r.status, message)) from None
        try:
            body = r.json() or {}
        except ValueError:
            what = "was larger than the answer limit" if r.truncated else "did not answer JSON: is this InfluxDB?"
            raise QueryError(f"{self.conn.url}/query {what}") from None
        errors = [str(body["error"])] if "error" in body else []
        errors += [str(res["error"]) for res in body.get("results", []) if "error" in res]
        if errors:
            raise QueryError(errors[0], diagnosis=self.explainer.diagnose(r.status, errors[0]))
        return body

    def close(self) -> None:
        self.http.close()

    def rows(self, q: str, db: str | None = None, epoch: str = "ns") -> list[dict[str, Any]]:
        """Every row of every series, as dicts with the series' tags and ``_measurement`` merged in."""
        out: list[dict[str, Any]] = []
        for res in self.raw(q, db=db, epoch=epoch).get("results", []):
            for s in res.get("series", []) or []:
                tags = s.get("tags") or {}
                for values in s.get("values", []):
                    row = dict(zip(s["columns"], values, strict=True))
                    row.update(tags)
                    row["_measurement"] = s.get("name")
                    out.append(row)
        return out
