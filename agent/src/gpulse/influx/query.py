"""InfluxQL over HTTP, for both APIs: what setup (v1), report, doctor and demo read and run.

InfluxDB 1.x serves ``/query`` natively; InfluxDB 2.x serves the same endpoint through its DBRP
mappings (``gpulse setup`` creates them), with ``Authorization: Token``. One small client covers
both, so every command reads the database the same way Grafana's InfluxQL datasource does.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpulse.influx.connection import ConfigError, Connection


class QueryError(Exception):
    """The server answered, but not with results (bad query, missing database, auth)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class InfluxQL:
    def __init__(self, conn: Connection, timeout: float | None = None) -> None:
        if not conn.url:
            raise ConfigError("this command needs --url")
        self.conn = conn
        self.timeout = timeout or conn.timeout_s

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.conn.api == "v2" and self.conn.token:
            headers["Authorization"] = f"Token {self.conn.token}"
        elif self.conn.api == "v1" and self.conn.token:
            user, password = self.conn.v1_credentials or ("", "")
            raw = base64.b64encode(f"{user}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {raw}"
        return headers

    def raw(self, q: str, db: str | None = None, epoch: str = "ns") -> dict[str, Any]:
        """POST ``/query`` and return the decoded JSON; raise :class:`QueryError` on any error."""
        params = {"q": q, "epoch": epoch}
        database = db if db is not None else self.conn.database
        if database:
            params["db"] = database
        if self.conn.api == "v2" and self.conn.org:
            params["org"] = self.conn.org
        data = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(f"{self.conn.url}/query", data=data, headers=self._headers(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                body = json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")[:500]
            try:
                text = json.loads(text).get("error") or json.loads(text).get("message") or text
            except (ValueError, AttributeError):
                pass
            raise QueryError(f"HTTP {e.code}: {text}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise QueryError(f"cannot reach {self.conn.url}: {getattr(e, 'reason', e)}") from None
        except ValueError:
            raise QueryError(f"{self.conn.url}/query did not answer JSON: is this InfluxDB?") from None
        if "error" in body:
            raise QueryError(str(body["error"]))
        for res in body.get("results", []):
            if "error" in res:
                raise QueryError(str(res["error"]))
        return body

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

    def execute(self, q: str, db: str | None = None) -> None:
        """Run a statement (CREATE ..., DROP ...) and raise on error."""
        self.raw(q, db=db)


def quote_ident(name: str) -> str:
    """An InfluxQL identifier in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_string(value: str) -> str:
    """An InfluxQL string literal in single quotes."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
