"""Checks of this node's own state: the configuration, directories the agent writes, the training
socket (and whether it may be trusted), and the disk spool of each sink."""

from __future__ import annotations

import os
import time

from gpulse.cli import advice
from gpulse.cli.checks.base import Check, Context, Result, Status, fail, ok

#: Data that waited longer than this many flush intervals means the database is not taking it.
STALE_FLUSHES = 5
#: The spool is "filling up" beyond this share of its cap.
SPOOL_WARN_SHARE = 0.8


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def writable_dir(name: str, path: str, what: str, fix: str) -> Result:
    """The directory exists and is writable, or could be created (nothing is created here)."""
    base = _nearest_existing(path)
    if not os.path.isdir(base):
        return fail(name, f"{what} {path}: {base} is not a directory", fix)
    if not os.access(base, os.W_OK | os.X_OK):
        return fail(name, f"{what} {path}: {base} is not writable by this user", fix)
    return ok(name, f"{what} {path} is writable" + ("" if base == os.path.abspath(path) else " (will be created)"))


def agent_command(ctx: Context, *extra: str) -> str:
    """``gpulse agent`` with the settings the doctor checked (``--simulate`` where there is no GPU)."""
    from gpulse.agent.config import default_spool_dir

    cfg = ctx.cfg
    args = ["agent"]
    if simulate := ctx.simulate():
        args += ["--simulate", str(simulate)]
    if cfg.connection.url:  # with --config first when the settings came from a file
        args += cfg.connection.command_flags()
    elif cfg.config_path:
        args += ["--config", cfg.config_path]
    if cfg.record:
        args += ["--record", cfg.record]
    if cfg.spool_dir != default_spool_dir():
        args += ["--spool-dir", cfg.spool_dir]
    if cfg.socket:
        args += ["--socket", cfg.socket]
    return advice.command(*args, *extra)


# -- the training socket ------------------------------------------------------------------------------
def check_socket(ctx: Context) -> Result:
    """The training channel: a socket nobody else controls (:func:`gpulse.channel.trust.verify_socket`),
    with an agent answering there, or a place the agent can create it."""
    from gpulse.channel.trust import UntrustedSocket, verify_socket

    cfg = ctx.cfg
    path = cfg.socket_path
    try:
        verify_socket(path, cfg.socket_group)
    except UntrustedSocket as e:
        return fail("socket", f"{e}: training would not send there, and the agent refuses it", e.fix)
    except KeyError:
        return fail(
            "socket", f"--socket-group {cfg.socket_group!r}: no such group on this machine", "name an existing group"
        )
    if os.path.exists(path):
        status, why = ctx.running_agent()
        if status is None:
            stale = "stale" in why
            return fail(
                "socket",
                why,
                f"start the agent: `{agent_command(ctx)}` (it replaces a stale socket)"
                if stale
                else "run training as the agent's user, or start the agent with --socket-group GROUP",
            )
        gpus = len(status.get("gpus") or [])
        return ok(
            "socket", f"agent {status.get('version', '')} answers on {path}, {gpus} GPU(s) ({status.get('source')})"
        )
    result = writable_dir(
        "socket",
        os.path.dirname(path),
        "socket directory",
        "choose a writable path with --socket (and GPULSE_SOCKET for training processes)",
    )
    if result.status is Status.OK:
        return ok("socket", f"no agent running; {result.detail}")
    return result


# -- one agent per node and destination -------------------------------------------------------------------
def check_instance(ctx: Context) -> Result:
    """Whether an agent already holds this configuration's socket or destination
    (:mod:`gpulse.agent.instance`): the running one for the doctor, a reason not to start for ``--check``."""
    from gpulse.agent.instance import AnotherAgent, running_holder

    found = running_holder(ctx.cfg)
    if found is None:
        return ok("agent", "no agent runs for this socket or destination")
    what, holder = found
    if ctx.live:
        return ok("agent", f"an agent runs for {what}: {holder.describe()}")
    refusal = AnotherAgent(what, holder)
    return fail("agent", f"this agent would not start: {refusal}", refusal.fix)


# -- the spool ------------------------------------------------------------------------------------------
def _age(seconds: float) -> str:
    from gpulse.report.units import duration

    return duration(seconds)


def check_spool(ctx: Context) -> Result:
    """Each sink's spool (lines, bytes, the oldest point's age), read without changing anything
    (:func:`gpulse.delivery.spool.inspect_spool`): damage, a spool near its cap, and (doctor) data that
    waited longer than a few flush intervals fail."""
    from gpulse.agent.status_line import human_bytes
    from gpulse.delivery.spool import HELD, inspect_spool

    cfg = ctx.cfg
    if not os.path.isdir(cfg.spool_dir):
        result = writable_dir("spool", cfg.spool_dir, "spool directory", "choose a writable directory with --spool-dir")
        return ok("spool", f"empty ({result.detail})") if result.status is Status.OK else result
    try:
        summary = inspect_spool(cfg.spool_dir)
    except OSError as e:
        return fail("spool", f"cannot read {cfg.spool_dir}: {e.strerror}", "run the doctor as the agent's user")
    now_ns = time.time_ns()
    head = f"{human_bytes(summary.bytes)} of {human_bytes(cfg.spool_max_bytes)} in {cfg.spool_dir}"
    ours = _destinations(ctx)
    lines, stale, held = [], [], []
    for s in summary.sinks or (summary,):
        if not (s.lines or s.damaged_records):
            continue
        age = (now_ns - s.oldest_point_ns) / 1e9 if s.oldest_point_ns is not None else None
        text = f"{s.name or '.'}: {s.lines} line(s), {human_bytes(s.bytes)}"
        text += f", oldest point {_age(age)} old" if age is not None else ""
        text += f" (for {s.destination})" if s.destination else ""
        elsewhere = s.name in ours and s.destination is not None and s.destination != ours[s.name]
        if HELD in s.name:
            held.append(s)
            text += "; kept aside: meant for another destination"
        elif elsewhere:
            held.append(s)
            text += f"; not meant for {ours[s.name]}: the agent keeps it aside when it starts"
        elif age is not None and age > STALE_FLUSHES * cfg.flush_interval:
            stale.append((s, age))
        lines.append(text)
    detail = "\n    ".join([head, *lines]) if lines else f"empty: {head}"
    if summary.damaged_records:
        return fail(
            "spool",
            f"{detail}\n    {summary.damaged_records} damaged record(s), {summary.damaged_lines} line(s) lost "
            "(torn write or corruption)",
            "nothing to do for the agent: at replay it skips the damaged part, counts what was lost and carries on",
        )
    if summary.bytes > SPOOL_WARN_SHARE * cfg.spool_max_bytes:
        return fail(
            "spool",
            f"{detail}\n    the database has not taken data for a while; the oldest data is dropped at the cap",
            "fix the database connection (see the checks above); raise --spool-max-bytes to hold out longer",
        )
    if stale and ctx.live:
        waited = max(age for _, age in stale)
        running, _why = ctx.running_agent()
        fix = (
            "the running agent cannot deliver: see the database checks above (`gpulse status` shows its last write)"
            if running
            else f"start the agent, which replays the spool in order: `{agent_command(ctx)}`"
        )
        return fail(
            "spool",
            f"{detail}\n    data has waited {_age(waited)}, more than {STALE_FLUSHES} flush intervals "
            f"({cfg.flush_interval:g} s each): it is not being delivered",
            fix,
        )
    if held:
        detail += "\n    the agent replays kept-aside data only with --replay-spool-to-new-destination"
    return ok("spool", detail)


def _destinations(ctx: Context) -> dict[str, str]:
    """sink folder name -> the destination this configuration's database sink writes to (none without one)."""
    if not ctx.conn.url:
        return {}
    from gpulse.sinks.factory import build_sinks

    sinks = build_sinks(ctx.conn, None)
    try:
        return {s.name: s.describe() for s in sinks}
    finally:
        for s in sinks:
            s.close()


# -- agent --check's own items ----------------------------------------------------------------------------
CONFIG = Check("config", lambda ctx: ok("config", ctx.cfg.describe()))
SOCKET = Check("socket", check_socket)
INSTANCE = Check("agent", check_instance)
SPOOL = Check("spool", check_spool)
RECORD = Check(
    "record",
    lambda ctx: writable_dir(
        "record",
        os.path.dirname(os.path.abspath(ctx.cfg.record or ".")),
        "record directory",
        "choose a writable path for --record",
    ),
)
