"""Advice gpulse prints: commands that work where they are printed.

Every command gpulse suggests is built here or from a constant a test reads, with the flags the
situation needs (the connection the user gave, ``--simulate`` where there is no GPU), so that it
can be followed as printed; ``tests/test_advice.py`` runs each one in the situation that prints it.
"""

from __future__ import annotations

import os
import shlex

from gpulse.influx.connection import DEFAULT_URL, Connection


def command(*args: str) -> str:
    """``gpulse ARGS`` quoted for a shell."""
    return shlex.join(["gpulse", *args])


def setup_command(conn: Connection) -> str:
    """``gpulse setup`` for this very connection (its config file too, when it came from one)."""
    return command("setup", *conn.command_flags())


def docker_engine_answers() -> bool:
    """A Docker engine answers on this machine (what ``make up`` needs to start InfluxDB)."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, no permission: no engine for us
        return False


def make_up_here() -> bool:
    """``make up`` can start the stack from here: the repository's compose file and a Docker engine."""
    return os.path.isfile("docker-compose.yml") and os.path.isfile("Makefile") and docker_engine_answers()


def record_locally(simulate: int | None) -> str:
    """What works without a database: the agent records, the report reads the recording.

    ``simulate``: the ``--simulate`` the agent command needs here (no GPU), if any."""
    record = command("agent", *(("--simulate", str(simulate)) if simulate else ()), "--record", "node.lp")
    return (
        f"without a database, `{record}` records locally and `{command('report', '--from-file', 'node.lp')}` reads it"
    )


def no_database(conn: Connection, without: str) -> str:
    """What gets this machine a database at ``conn.url``, then ``without`` (what works without one).

    ``make up`` is named only where it can start InfluxDB: a Docker engine and the repository here."""
    if (conn.url or DEFAULT_URL).rstrip("/") != DEFAULT_URL:
        return f"start the InfluxDB at {conn.url} or correct --url; {without}"
    if make_up_here():
        return f"`make up` starts InfluxDB 2 and Grafana in Docker here; {without}"
    return (
        "start your InfluxDB and name it with --url or GPULSE_URL (InfluxDB 1.x: also --api v1); `make up` cannot "
        f"start one here (it needs a Docker engine and the repository); {without}"
    )
