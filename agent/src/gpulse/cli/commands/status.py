"""``gpulse status``: ask the running agent for its own view, over its training-channel socket.

Sends a ``status`` request from a Linux abstract address (so the agent can answer without a file
being created) and prints the ``status_reply``: GPUs, the runs it hears from, lines/s, spool, last
successful write. ``--json`` prints the raw snapshot for scripts, and when no agent answers, ``{"error": ..., "fix": ...,
"socket": ...}`` (exit status 1), so stdout is JSON either way. It asks only an agent socket the
user can trust (the user's, root's, or one of ``--socket-group``: :mod:`gpulse.channel.trust`) and
believes only a reply from that socket's owner (:mod:`gpulse.channel.endpoint`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from gpulse.cli.exit_codes import ExitCode

EXIT_CODES = (
    ExitCode(0, "the agent answered"),
    ExitCode(1, "no agent answered (with --json, the reason is a JSON object on stdout too)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket", metavar="PATH", help="the agent's socket (default: $GPULSE_SOCKET, else the agent default)"
    )
    parser.add_argument(
        "--socket-group",
        metavar="GROUP",
        help="also trust a socket of this group (the agent's --socket-group; default: $GPULSE_SOCKET_GROUP)",
    )
    parser.add_argument("--json", action="store_true", help="print the agent's snapshot as JSON")
    parser.add_argument("--timeout", type=float, default=2.0, metavar="S", help="wait at most S seconds (default 2)")


class AgentUnreachable(Exception):
    """No agent answers on the socket (or none that may be trusted); the message says why, ``fix`` what to do."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


def query_status(path: str, timeout: float = 2.0, group: str | None = None) -> dict[str, Any]:
    """The agent's status snapshot, or :class:`AgentUnreachable`."""
    from gpulse.channel import protocol
    from gpulse.channel.endpoint import AgentEndpoint
    from gpulse.channel.trust import UntrustedSocket

    endpoint = AgentEndpoint(path, group)
    try:
        try:
            endpoint.send(protocol.encode(protocol.StatusRequest()), wait=timeout)
        except BlockingIOError:
            raise AgentUnreachable(
                f"the agent on {path} took no request within {timeout:g}s (its queue is full)"
            ) from None
        except UntrustedSocket as e:
            raise AgentUnreachable(f"{e}: not asking it", e.fix) from None
        except KeyError:
            raise AgentUnreachable(f"--socket-group {group!r}: no such group on this machine") from None
        except FileNotFoundError:
            raise AgentUnreachable(
                f"no agent socket at {path}: is 'gpulse agent' running (without --no-socket)?"
            ) from None
        except ConnectionRefusedError:
            raise AgentUnreachable(f"{path} exists but no agent listens on it (a stale socket)") from None
        except PermissionError:
            raise AgentUnreachable(
                f"no permission to write to {path}: the agent belongs to another user or group"
            ) from None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            endpoint.wait_readable(left)
            for data in endpoint.receive():
                reply = protocol.decode_reply(data)
                if type(reply) is protocol.StatusReply:
                    return reply.status
        raise AgentUnreachable(f"the agent on {path} did not answer within {timeout:g}s")
    finally:
        endpoint.close()


def render(status: dict[str, Any]) -> str:
    """A short human-readable page."""
    from gpulse.agent.status_line import format_status, human_age, human_bytes

    if "error" in status and "gpus" not in status:
        return f"agent answered with an error: {status['error']}"
    lines = [
        f"gpulse agent {status.get('version', '?')} on {status.get('host', '?')} (pid {status.get('pid', '?')}), "
        f"up {status.get('uptime_s', 0):.0f}s, sampling every {status.get('interval_s', '?')}s from {status.get('source', '?')}",
        format_status(status),
        "",
        "GPUs:",
    ]
    for g in status.get("gpus") or []:
        flags = " LOST" if g.get("lost") else ""
        run = f"  run={g['run']}" if g.get("run") else ""
        lines.append(f"  {g.get('index')}: {g.get('model')}  {g.get('uuid')}{run}{flags}")
    lines.append(f"Runs: {run_summary(status)}")
    lines += finding_lines(status.get("findings") or {})
    lines.append(f"Database: {status.get('database') or 'none (recording only)'}")
    if status.get("record"):
        lines.append(f"Recording to: {status['record']}")
    lines.append(
        f"Lines: {status.get('lines_written') or 0} written, {status.get('lines_spooled') or 0} spooled, "
        f"{status.get('lines_replayed') or 0} replayed, {status.get('lines_dropped') or 0} dropped, "
        f"{status.get('lines_rejected') or 0} rejected; {status.get('lines_per_s', 0):.0f} lines/s"
    )
    damaged = status.get("spool_damaged_lines") or 0
    damage = (
        f"; damage found at replay: {damaged} lines lost ({human_bytes(status.get('spool_damaged_bytes') or 0)})"
        if damaged or status.get("spool_damaged_bytes")
        else ""
    )
    lines.append(f"Spool: {human_bytes(status.get('spool_bytes') or 0)} in {status.get('spool_dir')}{damage}")
    for held in status.get("spool_held") or []:
        lines.append(
            f"Spool kept, not replayed: {held.get('lines')} lines in {held.get('path')} meant for "
            f"{held.get('destination')} (restart the agent with --replay-spool-to-new-destination to send them here)"
        )
    last = status.get("last_write_unix")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last)) if last else "never"
    lines.append(f"Last successful write: {when} ({human_age(status.get('last_write_age_s'))})")
    tc = status.get("training_channel") or {}
    lines.append(
        f"Training records: {status.get('records_received', 0)} received, {status.get('records_rejected', 0)} rejected"
        + (f", {tc.get('clients', 0)} client(s)" if tc else "")
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from gpulse.channel.protocol import client_socket_path
    from gpulse.channel.trust import SOCKET_GROUP_ENV

    path = args.socket or client_socket_path()
    try:
        status = query_status(path, args.timeout, args.socket_group or os.environ.get(SOCKET_GROUP_ENV) or None)
    except AgentUnreachable as e:
        print(f"gpulse status: {e}" + (f"\n  fix: {e.fix}" if e.fix else ""), file=sys.stderr)
        if args.json:  # a script reading stdout gets JSON either way
            print(json.dumps({"error": str(e), "fix": e.fix or None, "socket": path}, indent=2, sort_keys=True))
        return 1
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else render(status))
    return 0


def run_summary(status: dict[str, Any]) -> str:
    """Each run the agent hears from (:func:`~gpulse.agent.status_line.heard_runs`, the runs the headline
    counts), with its ranks and the GPUs it registered: a CPU-only run, or a GPU run before its ranks
    register, is listed too (from the processes its start points named)."""
    from gpulse.agent.status_line import heard_runs

    ranks: dict[str, set[str]] = {run: set() for run in heard_runs(status)}
    for p in status.get("training") or []:
        ranks[str(p.get("run"))].add(str(p.get("rank")))
    gpus: dict[str, list[str]] = {}
    for g in status.get("gpus") or []:
        if g.get("run"):
            gpus.setdefault(str(g["run"]), []).append(str(g.get("index")))
    parts = []
    for run in sorted(ranks):
        n = len(ranks[run])
        held = f"GPU {', '.join(gpus[run])}" if run in gpus else "no GPU registered"
        parts.append(f"{run} ({n} rank{'' if n == 1 else 's'}, {held})" if n else f"{run} ({held})")
    return "; ".join(parts) if parts else "none"


def finding_lines(findings: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each active run's open findings (the agent's rolling diagnosis), one line each."""
    if not findings:
        return ["Open findings: none"]
    out = ["Open findings:"]
    for run, open_ in sorted(findings.items()):
        for f in open_:
            out.append(
                f"  run {run}: {f.get('rule')} since step {f.get('first_step')} (last held at step "
                f"{f.get('last_step')}): {f.get('evidence')} Action: {f.get('action')}"
            )
    return out
