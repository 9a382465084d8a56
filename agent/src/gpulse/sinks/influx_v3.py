"""``--api v3``: ``POST /api/v3/write_lp?db=&precision=nanosecond&accept_partial=true`` (InfluxDB 3), gzipped.

The legacy endpoints of InfluxDB 3 refuse a whole batch for its first bad line and name at most that
one (``accept_partial`` is forced off for them: ``From<iox_http::write::WriteParams>`` in
``influxdb3_types/src/http.rs``), so a batch with bad lines would be bisected. ``write_lp`` with
``accept_partial=true`` writes the good lines and lists every bad one with its reason
(:func:`gpulse.sinks.errors.classify_http` reads the list; delivery dead-letters those lines only).
"""

from __future__ import annotations

from typing import Any

from gpulse.sinks.influx import InfluxSink


class InfluxV3Sink(InfluxSink):
    path = "/api/v3/write_lp"

    def __init__(self, url: str, token: str, database: str, **options: Any) -> None:
        """``options``: ``timeout_s``, ``verify_ssl``, ``token_source`` (see :class:`InfluxSink`)."""
        self.database = database
        # the default precision is "auto" (guessed from each timestamp's size): name it
        params = {"db": database, "precision": "nanosecond", "accept_partial": "true"}
        super().__init__(url, "v3", params, bucket=database, token=token, **options)

    def describe(self) -> str:
        return f"InfluxDB 3 API at {self.url} (database {self.database})"
