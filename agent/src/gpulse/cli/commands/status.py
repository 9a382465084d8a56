"""``gpulse status``: ask the running agent for its own view, over its training-channel socket.

Sends ``{"v":1,"kind":"status"}`` from a Linux abstract address (so the agent can answer without
a file being created) and prints the ``status_reply``: GPUs, registered runs, lines/s, spool,
last successful write. ``--json`` prints the raw snapshot for scripts.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket", metavar="PATH", help="the agent's socket (default: $GPULSE_SOCKET, else the agent default)"
    )
    parser.add_argument("--json", action="store_true", help="print the agent's snapshot as JSON")
    parser.add_argument("--timeout", type=float, default=2.0, metavar="S", help="wait at most S seconds (default 2)")


class AgentUnreachable(Exception):
    """No agent answers on the socket; the message says why."""


def query_status(path: str, timeout: float = 2.0) -> dict[str, Any]:
    """The agent's status snapshot, or :class:`AgentUnreachable`."""
    from gpulse.channel import protocol

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(protocol.client_address())
        try:
            sock.sendto(protocol.encode(protocol.status_request()), path)
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
            sock.settimeout(left)
            try:
                data = sock.recv(protocol.MAX_DATAGRAM + 1024)
            except TimeoutError:
                break
            try:
                messages = protocol.decode(data)
            except protocol.ProtocolError:
                continue
            for msg in messages:
                if msg.get("kind") == protocol.KIND_STATUS_REPLY and isinstance(msg.get("status"), dict):
                    return msg["status"]
        raise AgentUnreachable(f"the agent on {path} did not answer within {timeout:g}s")
    finally:
        sock.close()


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
    runs = sorted(set((status.get("runs") or {}).values()))
    lines.append(f"Runs registered: {', '.join(runs) if runs else 'none'}")
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

    path = args.socket or client_socket_path()
    try:
        status = query_status(path, args.timeout)
    except AgentUnreachable as e:
        print(f"gpulse status: {e}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else render(status))
    return 0
