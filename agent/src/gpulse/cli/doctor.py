"""``gpulse doctor``: every way a gpulse node can be misconfigured, checked and explained with a fix.

Each check returns a :class:`Result`: ``ok``, ``fail`` (with the fix) or ``skip`` (does not apply
here, e.g. no Docker engine to ask). The command exits 0 only when nothing failed. Checks reuse
what the agent itself runs (:mod:`gpulse.cli.agent_check`, the GPU source, the status request on the
socket, the spool reader), so the doctor and the agent never disagree about what works.
"""

from __future__ import annotations

import email.utils
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from gpulse.agent.config import AgentConfig
from gpulse.influx.connection import Connection

Status = Literal["ok", "fail", "skip"]
SYMBOL = {"ok": "✔", "fail": "✘", "skip": "–"}
#: Clock skew beyond this breaks joins of GPU samples with steps and the downsampling windows.
MAX_SKEW_S = 2.0
#: The spool is "filling up" beyond this share of its cap.
SPOOL_WARN_SHARE = 0.8


@dataclass(frozen=True)
class Result:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def render(self) -> str:
        text = f"{SYMBOL[self.status]} {self.name}: {self.detail}"
        if self.status == "fail" and self.fix:
            text += f"\n    fix: {self.fix}"
        return text


def ok(name: str, detail: str) -> Result:
    return Result(name, "ok", detail)


def fail(name: str, detail: str, fix: str) -> Result:
    return Result(name, "fail", detail, fix)


def skip(name: str, detail: str) -> Result:
    return Result(name, "skip", detail)


# -- GPUs -------------------------------------------------------------------------------------------
NO_DRIVER_FIX = (
    "install the NVIDIA driver until `nvidia-smi` works; inside a container, start it with the GPU "
    "(`--gpus all`, or the compose profile `agent`); without a GPU, `make demo` or `gpulse agent --simulate 8` show the rest"
)


def _ranges(indices: list[int]) -> str:
    """``0-3,6`` for [0, 1, 2, 3, 6]."""
    out: list[str] = []
    start = prev = None
    for i in sorted(indices):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)


def check_gpus(cfg: AgentConfig) -> Result:
    """Open the agent's GPU source, read one cycle, and list which metrics each GPU supports."""
    from gpulse.agent.loop import make_source
    from gpulse.sources.base import SourceUnavailable

    name = "gpus"
    try:
        source = make_source(cfg)
        gpus = source.open()
    except SourceUnavailable as e:
        return fail(name, f"NVML unavailable: {str(e).strip().rstrip('.')}", NO_DRIVER_FIX)
    except Exception as e:  # an unexpected library error is a finding, not a crash
        return fail(name, f"NVML failed: {type(e).__name__}: {e}", NO_DRIVER_FIX)
    try:
        readings = source.collect(time.time_ns())
    finally:
        source.close()
    if not gpus:
        return fail(name, "NVML works but lists no GPU", "check `nvidia-smi -L`; in a container, pass the GPUs in")
    infos = {r.gpu: r.fields for r in readings if r.measurement == "gpu_info"}
    groups: dict[tuple[str, str, str], list[int]] = {}
    for g in gpus:
        info = infos.get(g.index, {})
        supported = str(info.get("supported_metrics", ""))
        key = (g.model, supported, str(info.get("unsupported_metrics", "")))
        groups.setdefault(key, []).append(g.index)
    first = infos.get(gpus[0].index, {})
    kind = "simulated" if cfg.simulate else "NVML"
    versions = ", ".join(
        f"{label} {first[k]}" for label, k in (("driver", "driver_version"), ("CUDA", "cuda_version")) if first.get(k)
    )
    lines = [f"{len(gpus)} GPU(s) via {kind}" + (f" ({versions})" if versions else "")]
    for (model, supported, unsupported), idx in groups.items():
        n_sup = len([m for m in supported.split(",") if m])
        missing = [m for m in unsupported.split(",") if m]
        text = f"GPU {_ranges(idx)} {model}: {n_sup} metrics"
        text += f"; not supported: {', '.join(missing)}" if missing else "; every metric supported"
        lines.append(text)
    return ok(name, "\n    ".join(lines))


def _in_container() -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    try:
        with open("/proc/1/cgroup", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    return any(k in text for k in ("docker", "containerd", "kubepods", "libpod"))


def _host_pid_namespace() -> bool:
    """In the host's PID namespace, PID 1 is the init system, not the container's entrypoint."""
    try:
        with open("/proc/1/comm", encoding="utf-8") as f:
            return f.read().strip() in ("systemd", "init", "launchd", "runit", "s6-svscan")
    except OSError:
        return False


CDI_SPECS = ("/etc/cdi", "/var/run/cdi")
TOOLKIT_FIX = (
    "install the NVIDIA Container Toolkit, then `sudo nvidia-ctk runtime configure --runtime=docker && "
    "sudo systemctl restart docker`; check with `docker run --rm --gpus all ubuntu nvidia-smi`"
)


def check_containers(
    gpus: Result,
    *,
    simulated: bool = False,
    docker_info: Callable[[], dict[str, Any]] | None = None,
    in_container: bool | None = None,
    host_pid: bool | None = None,
) -> Result:
    """Can containers see the GPUs? Inside one: the GPUs and the host PID namespace are there; with a
    reachable Docker engine: it has the NVIDIA runtime (or CDI specs) to pass GPUs in."""
    name = "containers"
    if simulated:
        return skip(name, "simulated GPUs, nothing for containers to see")
    inside = _in_container() if in_container is None else in_container
    if inside:
        if gpus.status != "ok":  # the gpus check already says how to pass them in
            return skip(name, "inside a container without GPUs: see the gpus check")
        if not (_host_pid_namespace() if host_pid is None else host_pid):
            return fail(
                name,
                "inside a container with its own PID namespace: GPU processes show as unknown PIDs",
                "run the agent container with `pid: host` (the compose profile `agent` does)",
            )
    elif gpus.status != "ok":
        return skip(name, "no GPU on this host, so nothing for containers to see")
    try:
        info = (docker_info or _docker_info)()
    except Exception as e:  # docker not installed, socket absent, permission denied
        if inside:
            return ok(name, "inside a container that sees the GPUs, in the host PID namespace")
        return skip(name, f"no Docker engine reachable ({type(e).__name__}), containers not checked")
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    cdi = [d for d in CDI_SPECS if os.path.isdir(d) and any(f.startswith("nvidia") for f in os.listdir(d))]
    version = info.get("ServerVersion", "")
    if "nvidia" in runtimes or cdi:
        how = "the nvidia runtime" if "nvidia" in runtimes else f"CDI specs in {', '.join(cdi)}"
        return ok(
            name, f"Docker {version} can pass GPUs to containers ({how}; default runtime {info.get('DefaultRuntime')})"
        )
    return fail(name, f"Docker {version} has no NVIDIA runtime (runtimes: {', '.join(runtimes)})", TOOLKIT_FIX)


def _docker_info() -> dict[str, Any]:
    import docker

    client = docker.from_env(timeout=3)
    try:
        return client.info()
    finally:
        client.close()


# -- the database -----------------------------------------------------------------------------------
def check_reachable(conn: Connection) -> Result:
    from gpulse.influx.server import Problem, ServerProblem, probe_connection

    try:
        info = probe_connection(conn)
    except ServerProblem as e:
        d = e.diagnosis
        if d.problem is not Problem.UNREACHABLE:  # not InfluxDB, or the other generation than --api
            return fail("database", d.detail, d.fix)
        return fail(
            "database",
            d.detail,
            f"start InfluxDB (`make up`) or point gpulse at yours with --url / GPULSE_URL (now {conn.url})",
        )
    return ok("database", f"{conn.url} answers (InfluxDB {info.version})")


def check_credentials(conn: Connection) -> Result:
    from gpulse.cli.agent_check import check_v1, check_v2

    good, detail = check_v1(conn) if conn.api == "v1" else check_v2(conn)
    if good:
        return ok("token", detail)
    if "setup" in detail:
        fix = f"run `gpulse setup` with the same connection flags (it creates {conn.bucket!r} and the rest)"
    elif conn.api == "v1":
        fix = "put `user:password` of an InfluxDB 1.x user with write access in the --token-file (chmod 600)"
    else:
        fix = (
            "put a valid API token with write access to the bucket in the --token-file (chmod 600); "
            "`make up` writes the admin token to the file named in .env"
        )
    return fail("token", detail, fix)


def check_layout(conn: Connection) -> Result:
    """v1: the database and its retention policies; v2: the org, the three buckets and the DBRP mappings."""
    from gpulse.influx.downsample import RAW, TIERS

    tiers = [RAW, *(t.name for t in TIERS)]
    fix = "run `gpulse setup` with the same connection flags (idempotent: it only adds what is missing)"
    if conn.api == "v1":
        from gpulse.influx.query import InfluxQL, QueryError, quote_ident

        try:
            rows = InfluxQL(conn).rows(f"SHOW RETENTION POLICIES ON {quote_ident(conn.database)}", db="")
        except QueryError as e:
            return fail("layout", f"cannot list retention policies on {conn.database!r}: {e}", fix)
        have = {r["name"]: r for r in rows}
        missing = [t for t in tiers if t not in have]
        if missing:
            return fail("layout", f"database {conn.database!r} lacks retention policies {', '.join(missing)}", fix)
        default = next((n for n, r in have.items() if r.get("default")), "?")
        if default != RAW:
            return fail("layout", f"the default retention policy of {conn.database!r} is {default!r}, not {RAW!r}", fix)
        spans = ", ".join(f"{t} ({_rp_duration(str(have[t].get('duration')))})" for t in tiers)
        return ok("layout", f"database {conn.database!r}: retention policies {spans}, default {RAW}")
    return _check_layout_v2(conn, tiers, fix)


def _check_layout_v2(conn: Connection, tiers: list[str], fix: str) -> Result:
    from influxdb_client import InfluxDBClient
    from influxdb_client.service.dbr_ps_service import DBRPsService

    from gpulse.influx.downsample import bucket_name

    with InfluxDBClient(url=conn.url, token=conn.token, org=conn.org, timeout=int(conn.timeout_s * 1000)) as client:
        try:
            orgs = client.organizations_api().find_organizations(org=conn.org)
        except Exception as e:
            return fail(
                "layout",
                f"cannot find org {conn.org!r}: {_api_error(e)}",
                "check --org (the compose stack uses the org in .env)",
            )
        if not orgs:
            return fail(
                "layout", f"org {conn.org!r} does not exist", "check --org (the compose stack uses the org in .env)"
            )
        org_id = orgs[0].id
        buckets = client.buckets_api()
        spans = []
        missing = []
        for t in tiers:
            b = buckets.find_bucket_by_name(bucket_name(conn.bucket, t))
            if b is None:
                missing.append(bucket_name(conn.bucket, t))
                continue
            rules = b.retention_rules or []
            secs = rules[0].every_seconds if rules else 0
            spans.append(f"{b.name} ({_human_seconds(secs)})")
        if missing:
            return fail("layout", f"org {conn.org!r} lacks bucket(s) {', '.join(missing)}", fix)
        try:
            dbrps = DBRPsService(client.api_client).get_dbr_ps(org_id=org_id, db=conn.database).content or []
        except Exception as e:
            return fail("layout", f"cannot list DBRP mappings: {_api_error(e)}", fix)
        rps = {d.retention_policy for d in dbrps}
        lacking = [t for t in tiers if t not in rps]
        if lacking:
            return fail(
                "layout",
                f"no DBRP mapping for {conn.database}/{', '.join(lacking)}: Grafana's InfluxQL panels will be empty",
                fix,
            )
    return ok(
        "layout", f"org {conn.org!r}: buckets {', '.join(spans)}; InfluxQL sees {conn.database} with {', '.join(tiers)}"
    )


def _rp_duration(go: str) -> str:
    """``720h0m0s`` -> ``30d``, ``0s`` -> ``INF``: as `gpulse setup` spells retentions."""
    from gpulse.influx.downsample import parse_duration
    from gpulse.influx.setup.common import influx_duration

    try:
        return influx_duration(parse_duration(go) // 10**9)
    except ValueError:
        return go


def _human_seconds(secs: int | None) -> str:
    if not secs:
        return "forever"
    return f"{secs // 86400}d" if secs % 86400 == 0 else f"{secs}s"


def _api_error(e: Exception) -> str:
    status = getattr(e, "status", None)
    return (
        f"HTTP {status}: {getattr(e, 'message', None) or getattr(e, 'reason', '')}"
        if status
        else f"{type(e).__name__}: {e}"
    )


def check_downsampling(conn: Connection) -> Result:
    """v1: the continuous queries exist; v2: the tasks exist, are active, and their last run succeeded."""
    from gpulse.influx.downsample import TIERS, continuous_queries, task_name

    fix = "run `gpulse setup` with the same connection flags (it creates or updates the downsampling)"
    if conn.api == "v1":
        from gpulse.influx.query import InfluxQL, QueryError

        try:
            rows = InfluxQL(conn).rows("SHOW CONTINUOUS QUERIES", db="")
        except QueryError as e:
            return fail("downsampling", f"cannot list continuous queries: {e}", fix)
        have = {r["name"] for r in rows if r.get("_measurement") == conn.database}
        want = set(continuous_queries(conn.database))
        missing = sorted(want - have)
        if missing:
            return fail(
                "downsampling", f"{len(missing)} of {len(want)} continuous queries missing, e.g. {missing[0]}", fix
            )
        return ok(
            "downsampling", f"{len(want)} continuous queries on {conn.database!r} ({', '.join(t.name for t in TIERS)})"
        )
    from influxdb_client import InfluxDBClient

    names = [task_name(t) for t in TIERS]
    with InfluxDBClient(url=conn.url, token=conn.token, org=conn.org, timeout=int(conn.timeout_s * 1000)) as client:
        try:
            tasks = [t for t in client.tasks_api().find_tasks() if t.name in names]
        except Exception as e:
            return fail("downsampling", f"cannot list tasks: {_api_error(e)}", fix)
    by_name = {t.name: t for t in tasks}
    missing = [n for n in names if n not in by_name]
    if missing:
        return fail("downsampling", f"task(s) {', '.join(missing)} missing", fix)
    states = []
    for n in names:
        t = by_name[n]
        if t.status != "active":
            return fail(
                "downsampling",
                f"task {n} is {t.status}",
                f"activate it: `influx task update --id {t.id} --status active`",
            )
        if t.last_run_status == "failed":
            return fail(
                "downsampling",
                f"the last run of task {n} failed: {t.last_run_error or 'no message'}",
                f"read its log with `influx task log list --task-id {t.id}`, then re-run `gpulse setup`",
            )
        states.append(f"{n} {t.last_run_status or 'not run yet'}")
    return ok("downsampling", "; ".join(states))


def check_clock(conn: Connection, now: Callable[[], float] = time.time) -> Result:
    """Compare this host's clock with the server's ``Date`` header (1 s resolution, so ±1 s)."""
    from gpulse.influx.server import ServerProblem, probe

    t0 = now()
    try:
        date = probe(conn.url or "", timeout_s=conn.timeout_s, verify_tls=conn.verify_ssl).date
    except ServerProblem as e:
        return skip("clock", f"{e.diagnosis.detail}, skew not measured")
    t1 = now()
    if not date:
        return skip("clock", "the server sends no Date header, skew not measured")
    server = email.utils.parsedate_to_datetime(date).timestamp() + 0.5  # the header truncates to the second
    skew = (t0 + t1) / 2 - server
    if abs(skew) > MAX_SKEW_S + (t1 - t0) / 2:
        return fail(
            "clock",
            f"this host's clock is {skew:+.1f}s off the database's",
            "enable time sync on both machines (`timedatectl set-ntp true`, chrony or systemd-timesyncd)",
        )
    return ok("clock", f"within {max(abs(skew), 0.5):.1f}s of the database (limit {MAX_SKEW_S:g}s)")


# -- local state ------------------------------------------------------------------------------------
def check_socket(cfg: AgentConfig) -> Result:
    """The training channel: an agent answering there, or a path the agent can create."""
    from gpulse.cli.agent_check import check_writable_dir
    from gpulse.cli.commands.status import AgentUnreachable, query_status

    path = cfg.socket_path
    if os.path.exists(path):
        try:
            status = query_status(path, timeout=1.0)
        except AgentUnreachable as e:
            stale = "stale" in str(e)
            return fail(
                "socket",
                str(e),
                "start `gpulse agent` (it replaces a stale socket)"
                if stale
                else "run training as the agent's user, or start the agent with --socket-group GROUP",
            )
        return ok(
            "socket", f"agent {status.get('version', '')} answers on {path}, {len(status.get('gpus') or [])} GPU(s)"
        )
    directory = os.path.dirname(path)
    if os.path.isdir(directory):
        st = os.stat(directory)
        if st.st_uid != os.getuid():
            return fail(
                "socket",
                f"{directory} belongs to uid {st.st_uid}, the agent refuses to use it",
                "remove it or choose another path with --socket (training: GPULSE_SOCKET)",
            )
    good, detail = check_writable_dir(directory, "socket directory")
    if good:
        return ok("socket", f"no agent running; {detail}")
    return fail("socket", detail, "choose a writable path with --socket (and GPULSE_SOCKET for training processes)")


@dataclass(frozen=True)
class SpoolReport:
    segments: int
    bytes: int
    records: int  # intact records waiting (from the read position on)
    lines: int
    corrupt_segments: int


def inspect_spool(directory: str) -> SpoolReport:
    """Read every segment of a spool without changing anything (the agent's :class:`gpulse.delivery.spool.Spool`
    deletes and re-points as it opens, which a diagnosis must not do). Same record format: a header
    (magic, crc32 of everything after it, payload length, line count, epoch, ticket) then the payload."""
    import zlib

    from gpulse.delivery.spool import _SEGMENT, HEADER, MAGIC

    root = os.path.abspath(directory)
    segments = sorted(int(m.group(1)) for n in os.listdir(root) if (m := _SEGMENT.match(n)))
    try:
        with open(os.path.join(root, "ack"), encoding="utf-8") as f:
            ack_seg, ack_off = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        ack_seg, ack_off = 0, 0
    total = records = lines = corrupt = 0
    for seg in segments:
        path = os.path.join(root, f"{seg:020d}.seg")
        with open(path, "rb") as f:
            data = f.read()
        total += len(data)
        off = ack_off if seg == ack_seg else 0
        if seg < ack_seg:
            continue  # delivered; the agent deletes it at its next start
        while off < len(data):
            head = data[off : off + HEADER.size]
            if len(head) < HEADER.size:
                corrupt += 1
                break
            magic, crc, plen, nlines, _epoch, _ticket = HEADER.unpack(head)
            payload = data[off + HEADER.size : off + HEADER.size + plen]
            if magic != MAGIC or len(payload) != plen or zlib.crc32(payload, zlib.crc32(head[8:])) != crc:
                corrupt += 1
                break
            records += 1
            lines += nlines
            off += HEADER.size + plen
    return SpoolReport(len(segments), total, records, lines, corrupt)


def check_spool(cfg: AgentConfig) -> Result:
    """Size against the cap, and every waiting record's checksum, read without changing anything."""
    from gpulse.cli.agent_check import check_writable_dir

    if not os.path.isdir(cfg.spool_dir):
        good, detail = check_writable_dir(cfg.spool_dir, "spool directory")
        if good:
            return ok("spool", f"empty ({detail})")
        return fail("spool", detail, "choose a writable directory with --spool-dir")
    try:
        report = inspect_spool(cfg.spool_dir)
    except OSError as e:
        return fail("spool", f"cannot read {cfg.spool_dir}: {e.strerror}", "run the doctor as the agent's user")
    text = (
        f"{report.segments} segment(s), {_human_bytes(report.bytes)} of {_human_bytes(cfg.spool_max_bytes)} "
        f"in {cfg.spool_dir}"
    )
    if report.corrupt_segments:
        return fail(
            "spool",
            f"{text}; {report.corrupt_segments} segment(s) damaged (torn write or corruption)",
            "nothing to do for the agent: at replay it skips the damaged part, counts what was lost and carries on",
        )
    if report.bytes > SPOOL_WARN_SHARE * cfg.spool_max_bytes:
        return fail(
            "spool",
            f"{text}: the database has not taken data for a while; the oldest data is dropped at the cap",
            "fix the database connection (see the checks above); raise --spool-max-bytes to hold out longer",
        )
    waiting = f", {report.lines} line(s) waiting to be replayed" if report.lines else ""
    return ok("spool", text + waiting)


def _human_bytes(n: float) -> str:
    from gpulse.agent.status_line import human_bytes

    return human_bytes(n)


# -- all of it --------------------------------------------------------------------------------------
CHECKS = ("gpus", "containers", "database", "token", "layout", "downsampling", "clock", "socket", "spool")


def run_checks(cfg: AgentConfig, skip_names: Iterable[str] = ()) -> list[Result]:
    """Every check, in an order where an earlier failure explains a later one; a database that does
    not answer makes the database checks after it ``skip``."""
    skipped = set(skip_names)
    results: list[Result] = []

    def add(name: str, fn: Callable[[], Result]) -> Result:
        if name in skipped:
            r = skip(name, "skipped (--skip)")
        else:
            try:
                r = fn()
            except Exception as e:  # a check reports, it never crashes the doctor
                r = fail(name, f"the check itself failed: {type(e).__name__}: {e}", "run with -v and report it")
        results.append(r)
        return r

    gpus = add("gpus", lambda: check_gpus(cfg))
    add("containers", lambda: check_containers(gpus, simulated=bool(cfg.simulate)))
    conn = cfg.connection
    if not conn.url:
        for name in ("database", "token", "layout", "downsampling", "clock"):
            results.append(skip(name, "no database configured (recording only)"))
    else:
        reach = add("database", lambda: check_reachable(conn))
        if reach.status != "ok":
            for name in ("token", "layout", "downsampling", "clock"):
                results.append(skip(name, "database unreachable"))
        else:
            token = add("token", lambda: check_credentials(conn))
            for name, fn in (("layout", check_layout), ("downsampling", check_downsampling)):
                if token.status == "fail" and "setup" not in token.detail:
                    results.append(skip(name, "credentials rejected"))
                else:
                    add(name, lambda fn=fn: fn(conn))
            add("clock", lambda: check_clock(conn))
    add("socket", lambda: check_socket(cfg))
    add("spool", lambda: check_spool(cfg))
    return results


def render(results: list[Result], conn: Connection | None = None) -> str:
    failed = sum(r.status == "fail" for r in results)
    passed = sum(r.status == "ok" for r in results)
    head = [f"gpulse doctor: {conn.describe()}"] if conn is not None and conn.url else []
    verdict = (f"all {passed} checks passed" if not failed else f"{failed} check(s) failed, {passed} passed") + (
        f", {len(results) - failed - passed} not applicable" if len(results) - failed - passed else ""
    )
    return "\n".join([*head, *(r.render() for r in results), verdict]) + "\n"
