"""What the database checks ask the management APIs, and how they say a refusal: one GET, classified.

Shared by the v2 checks (:mod:`gpulse.cli.checks.database`) and the InfluxDB 3 ones
(:mod:`gpulse.cli.checks.database_v3`); every refusal is explained by :mod:`gpulse.influx.server`.
"""

from __future__ import annotations

from typing import Any

from gpulse.cli.checks.base import Context, Result, fail


def refusal(name: str, status: int | None, message: str, diagnosis: Any) -> Result:
    """A refusal the server explained (:func:`gpulse.influx.server.diagnose`): its kind, its words, the fix."""
    answer = f"HTTP {status}: {message}" if status else message
    if diagnosis is None:
        return fail(name, answer, "run with -v and check the server's log")
    return fail(name, f"{diagnosis.detail} ({answer})", diagnosis.fix)


def get_json(ctx: Context, path: str, params: dict[str, Any], *, name: str = "token", forbidden: Any = None) -> Any:
    """GET a management endpoint (v2 or v3): the decoded JSON, or the failed :class:`Result` (refusals classified);
    ``forbidden``, when given, instead of the failure for a 403 (a token the server knows, not allowed there)."""
    from gpulse.influx.http import HTTPStatusError, TransportError
    from gpulse.influx.server import Explainer

    try:
        with ctx.conn.http_client() as client:
            return client.get_json(path, params=params)
    except HTTPStatusError as e:
        status, message = e.response.status, e.response.message()
        if status == 403 and forbidden is not None:
            return forbidden
        return refusal(name, status, message, Explainer(ctx.conn, ctx.server).diagnose(status, message))
    except TransportError as e:
        return fail(name, e.describe(), "see the database check")
