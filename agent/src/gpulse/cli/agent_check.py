"""``gpulse agent --check``: would the agent start as configured? One verdict per item, exit 0 only if none failed.

A subset of the doctor's checks (:mod:`gpulse.cli.checks`), asked about this configuration rather
than the running node: the configuration, whether another agent holds its socket or destination, the GPUs, the spool and record directories, and the
database (the server, the credentials, the bucket the agent writes to). Its own output format
(``ok`` / ``FAIL`` / ``SKIP`` and one verdict line); a skipped item is never counted as failed.
"""

from __future__ import annotations

import sys
from typing import TextIO

from gpulse.agent.config import AgentConfig
from gpulse.cli.checks import database, gpus, local
from gpulse.cli.checks.base import Check, Context, Result, Status, fail, render_agent_check, run_checks

CHECKS: tuple[Check, ...] = (
    local.CONFIG,
    local.INSTANCE,
    gpus.GPUS,
    local.SPOOL,
    database.DATABASE,
    database.TOKEN,
    database.BUCKET,
)


def results(cfg: AgentConfig) -> list[Result]:
    checks = list(CHECKS)
    if cfg.record:
        checks.insert(4, local.RECORD)
    return run_checks(checks, Context(cfg, live=False))


def run(cfg: AgentConfig, out: TextIO | None = None) -> int:
    """Print one verdict per item; 0 only if none failed."""
    done = results(cfg)
    (out or sys.stdout).write(render_agent_check(done))
    return int(any(r.status is Status.FAIL for r in done))


def invalid_config(error: Exception, out: TextIO | None = None) -> int:
    """The configuration does not load: that is the one failed item."""
    (out or sys.stdout).write(render_agent_check([fail("config", str(error), "correct the setting named above")]))
    return 1
