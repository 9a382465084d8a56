"""Every dashboard and alert query, as Grafana would send it, returns data from a real InfluxDB 1.x.

The database is prepared by ``gpulse setup --api v1`` and filled by the real agent (``gpulse agent
--simulate 2``, run in-process from the command's own flag parser so the test can plant an XID
event in the simulated GPUs) and by a real two-rank :class:`gpulse.training.Run` talking to that
agent over its socket. Two things a CPU-only machine cannot produce are stood in for at the CUDA
boundary, exactly where a GPU run would supply them: the allocator counters (a fake
``torch._C._cuda_memoryStats``) and the ``register`` message carrying the run's GPU UUIDs. The
History dashboard is queried after ``downsample_now`` ran the continuous queries' ``SELECT INTO``.

No Grafana server exists here: :func:`support.grafana_interpolate.interpolate` reproduces its macro
and variable substitution, and :func:`evaluate` below stands in for Grafana's server-side alert
expressions (reduce ``last``, ``&&``-joined comparisons in math, thresholds).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from grafana_ts import backend_frames, ensure_installed, grafana, misreads
from support.grafana_interpolate import interpolate
from support.grafana_queries import annotation_queries, data_rows, panel_queries, panel_rows, resolve_variables
from support.old_run import setup_v1 as _setup

from gpulse import schema
from gpulse.dashboards import alerts, dashboards, history
from gpulse.dashboards.builder import DATASOURCE_UID
from gpulse.influx import downsample
from gpulse.influx.connection import Connection
from gpulse.lineprotocol.encode import Encoder
from gpulse.report.live import FindingState, LiveFinding

pytestmark = pytest.mark.influxdb

HOST = "dash-node"
RUN_ID = "dash-run"
NS = 1_000_000_000
AGENT_SECONDS = 13.0
#: The range a user looks at right after starting the agent; History keeps its own (30 days).
RECENT = "now-5m"


# -- the fixture: setup, agent, training run, downsampling ------------------------------------------
class _FakeCudaC:
    """``torch._C`` as the allocator-counter reader sees it on a GPU (absent on this CPU machine)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.calls = 0

    def _cuda_memoryStats(self, _device: int) -> dict[str, Any]:
        self.calls += 1
        base = (30 + self.rank * 2) << 30
        return {
            "allocated_bytes": {"all": {"current": base, "peak": base + (self.calls % 5 << 28)}},
            "reserved_bytes": {"all": {"current": base + (4 << 30)}},
            "num_alloc_retries": 0,
        }

    def _cuda_resetPeakMemoryStats(self, _device: int) -> None:
        pass


class _FakeTorch:
    """``torch`` with ``torch.cuda``'s allocator-statistics functions (the probe uses the ``_C`` ones)."""

    def __init__(self, rank: int) -> None:
        self._C = _FakeCudaC(rank)
        self.cuda = self

    def memory_stats(self, _device: int) -> dict[str, Any]:
        raise AssertionError("the probe reads torch._C._cuda_memoryStats")

    def reset_peak_memory_stats(self, _device: int) -> None:
        raise AssertionError("the probe resets through torch._C")


def _make_run(rank: int, sock: str, out: Path) -> Any:
    """Rank ``rank`` of a 2-rank job, as a launcher's environment would make it."""
    from gpulse.training import Run

    saved = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    try:
        return Run(
            name="dashboard-test",
            run_id=RUN_ID,
            config={"model": "tiny", "lr": 3e-4},
            output_dir=out / f"rank{rank}",
            socket_path=sock,
            flops_per_token=6e9,
            peak_flops=1e15,
            write_report=False,
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _batches() -> Iterator[int]:
    """A data loader that takes 4 ms per batch (what data_wait_s measures)."""
    for i in range(10_000):
        time.sleep(0.004)
        yield i


def _train(run: Any, uuid: str, ready: threading.Event, done: list[int]) -> None:
    """One rank's training loop: timed phases, data wait, comm, loss, an eval mark; rank 0 records a
    profiler window."""
    from gpulse.channel import protocol
    from gpulse.training.memory import MemoryProbe

    rank = run.rank
    ready.wait(10)
    run.steps.memory = MemoryProbe(_FakeTorch(rank), 0)  # the CUDA allocator a GPU run reads
    run.client.submit(protocol.Register(RUN_ID, str(rank), os.getpid(), (uuid,)))  # what a CUDA run sends
    loader = run.wrap_loader(_batches())
    deadline = time.monotonic() + 6.0
    for i, _batch in enumerate(loader):
        if time.monotonic() > deadline:
            break
        with run.step(samples=8, tokens=8 * 512):
            with run.phase("forward"):
                time.sleep(0.01 + 0.004 * rank)
            with run.phase("backward"):
                time.sleep(0.02)
                run.add_comm(4_000_000)
            with run.phase("optimizer"):
                time.sleep(0.003)
            run.log(loss=3.0 / (1 + i * 0.05))
        if i == 20:
            run.mark("eval", f"eval loss {2.5 - rank * 0.01:.2f}")
        if i == 10 and rank == 0:  # what a finding the agent raised asks for (its window is minutes long)
            # (a rule that takes no py-spy dump: this process's children are the test's servers, no workers)
            assert run.profile_window.request("communication", "asked for by the dashboard test")
    run.finish()
    done.append(rank)  # an exception instead is printed by threading's excepthook


class OnDatabase:
    """The test server seen through another database: what Grafana's datasource does with ``dbName``."""

    def __init__(self, influx: Any, db: str) -> None:
        self.influx, self.db = influx, db

    def query(self, q: str, db: str | None = None, **kw: Any) -> dict[str, Any]:
        return self.influx.query(q, db=self.db, **kw)

    def rows(self, q: str, db: str | None = None, **kw: Any) -> list[dict[str, Any]]:
        return self.influx.rows(q, db=self.db, **kw)


def _write_alert_situations(influx: Any, now: int) -> None:
    """Situations a 13-second simulation cannot show, on hosts of their own: an idle GPU holding memory
    for 15 minutes, a GPU with uncorrected ECC errors, an agent silent for 5 minutes, and an agent
    whose spool grew for 10 minutes; and the rolling findings a run raises only over minutes: one the
    user's run raised and cleared, one still open on a node of its own."""
    enc = Encoder()
    gpu = enc.series("gpu", {"host": "idle-node", "gpu": "0", "uuid": "GPU-idle", "model": "NVIDIA H100"})
    lines = [enc.line(gpu, {"util_gpu_pct": 2.0, "mem_used_bytes": 20 << 30}, now - s * NS) for s in range(0, 1200, 30)]
    ecc = enc.series("gpu", {"host": "ecc-node", "gpu": "3", "uuid": "GPU-ecc", "model": "NVIDIA H100"})
    lines += [enc.line(ecc, {"ecc_uncorrected_volatile": 2, "temp_gpu_c": 60.0}, now - s * NS) for s in (600, 60)]
    silent = enc.series("agent", {"host": "silent-node"})
    lines += [enc.line(silent, {"uptime_s": 1800.0 - s, "spool_bytes": 0}, now - s * NS) for s in range(300, 1800, 10)]
    spooling = enc.series("agent", {"host": "spooling-node"})
    lines += [
        enc.line(spooling, {"uptime_s": 900.0 - s, "spool_bytes": 1_000_000 - s * 1000}, now - s * NS)
        for s in range(0, 600, 10)
    ]
    for host, run, rule, states in (
        (HOST, RUN_ID, "data_loading", (FindingState.RAISED, FindingState.CLEARED)),
        ("finding-node", "stuck-run", "rank_imbalance", (FindingState.RAISED,)),
    ):
        series = enc.series("train_finding", {"host": host, "run": run, "rule": rule})
        for i, state in enumerate(states):
            ts = now - (240 - 120 * i) * NS
            f = LiveFinding(
                run, rule, state, rule, "what the window showed", "what to do", "a threshold", 10, 50, ts, 40
            )
            lines.append(enc.line(series, f.fields(), ts))
    influx.write("".join(line for line in lines if line))


@pytest.fixture(scope="module")
def filled(influxdb_module: Any, repo_root: Path) -> Iterator[dict[str, Any]]:
    import torch  # noqa: F401  (rank 0's profiler window profiles torch; imported before the clock runs)

    from gpulse.agent import loop
    from gpulse.agent.config import load_config
    from gpulse.agent.loop import Agent
    from gpulse.cli.commands import agent as agent_cmd
    from gpulse.influx.setup.v1 import downsample_now
    from gpulse.sources.simulated import SimulatedSource

    url = influxdb_module.url
    how_setup = _setup(url)
    work = Path(tempfile.mkdtemp(prefix="gpd"))
    sock = str(work / "agent.sock")
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    args = parser.parse_args(
        ["--api", "v1", "--url", url, "--bucket", "gpulse", "--simulate", "2", "--host", HOST, "--interval", "0.25",
         "--self-metrics-interval", "1", "--flush-interval", "0.5", "--duration", str(AGENT_SECONDS),
         "--spool-dir", str(work / "spool"), "--socket", sock]
    )  # fmt: skip
    cfg = load_config(args, env={})
    # GPU 0 trains flat out; GPU 1 is thermally throttled and reports an XID 2 s in.
    source = SimulatedSource(2, seed=7, scenario=lambda _t, gpu: "busy" if gpu == 0 else "throttled")
    source.inject_event(1, time.time_ns() + 2 * NS, "xid", 79, "GPU has fallen off the bus")
    uuids = [source._uuid(i) for i in range(2)]
    agent = Agent(cfg, source=source, stream=io.StringIO(), tty=False)
    saved_every, loop.GPU_INFO_EVERY_S = loop.GPU_INFO_EVERY_S, 3  # the hourly gpu_info repeat, sped up

    ready, done = threading.Event(), []
    runs = [_make_run(r, sock, work) for r in range(2)]
    ranks = [threading.Thread(target=_train, args=(run, uuids[run.rank], ready, done), daemon=True) for run in runs]
    for t in ranks:
        t.start()

    def when_socket_exists() -> None:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the first GPU cycles land before the run registers
        ready.set()

    threading.Thread(target=when_socket_exists, daemon=True).start()
    start = time.time_ns()
    try:
        assert agent.run() == 0
    finally:
        loop.GPU_INFO_EVERY_S = saved_every
    for t in ranks:
        t.join(30)
    assert sorted(done) == [0, 1], "a training rank failed (its traceback is above)"
    end = time.time_ns()
    _write_alert_situations(influxdb_module, end)
    written = downsample_now(Connection(url=url, api="v1", bucket="gpulse"), end - 30 * 60 * NS, end + NS)
    yield {
        "influx": influxdb_module,
        "setup": how_setup,
        "start": start,
        "end": end,
        "downsampled": written,
        "work": work,
    }


@pytest.mark.parametrize("dashboard", dashboards(), ids=lambda d: d.slug)
def test_every_panel_variable_and_annotation_of_a_dashboard_returns_data(
    filled: dict[str, Any], dashboard: Any
) -> None:
    influx = filled["influx"]
    dash = dashboard.to_json()
    time_from = dash["time"]["from"] if dashboard.slug == "history" else RECENT
    # the user picks the simulated node and the run; hosts written only for the alert tests stay out
    counts = panel_rows(influx, dash, time_from, {"host": HOST, "run": RUN_ID})
    with_data = sum(1 for n in counts.values() if n)
    print(
        f"\n{dashboard.title}: {with_data}/{len(counts)} panels and annotations returned data (db prepared by {filled['setup']})"
    )
    for title, n in counts.items():
        print(f"  {n:6d} rows  {title}")
    assert [t for t, n in counts.items() if n == 0] == []


def test_a_profiler_window_is_an_annotation_of_the_run_with_its_summary_and_trace(filled: dict[str, Any]) -> None:
    """The window's ``train_event`` (kind ``profile``), sent by the run through the agent, is among the
    Training run dashboard's "Run events" annotations, tagged ``profile``, its text the window's summary
    and the trace's path. (The ``train_finding`` annotation is the agent's, written at the raise, before
    any window exists: the profile is an annotation of its own.)"""
    influx = filled["influx"]
    dash = _by_slug("training-run")
    variables = resolve_variables(influx, dash, RECENT, {"host": HOST, "run": RUN_ID})
    [(_, query)] = [(n, q) for n, q in annotation_queries(dash, variables, RECENT) if n == "Run events"]
    [row] = [r for r in influx.rows(query) if r.get("kind") == "profile"]
    [trace] = (filled["work"] / "rank0" / "gpulse-profiles").glob("*.pt.trace.json.gz")
    assert row["text"].startswith("profile for communication: 3 steps in ") and f"trace {trace}" in row["text"]
    assert "top self time: " in row["text"] and "DataLoader wait" in row["text"]


def test_history_reads_points_the_continuous_queries_wrote_into_the_downsampled_policies(
    filled: dict[str, Any],
) -> None:
    influx = filled["influx"]
    assert filled["downsampled"] > 0
    fields = {out for p in downsample.pipelines(downsample.TIERS[0]) for _, out in p.outputs("gpu")}
    for rp in ("1m", "1h"):
        rows = influx.rows(f'SELECT * FROM "gpulse"."{rp}"."gpu" WHERE "host" = \'{HOST}\'')
        assert rows, rp
        stored = {k for row in rows for k, v in row.items() if v is not None} - {
            "time",
            "_measurement",
            *schema.GPU.all_tags,
        }
        assert {"sm_active_pct", "sm_active_pct_max", "sm_active_pct_min", "energy_mj"} <= stored <= fields
    raw_only = influx.rows('SELECT count("util_gpu_pct") FROM "gpulse"."raw"."gpu"')
    assert raw_only and raw_only[0]["count"] > 0


def test_the_run_appears_on_its_gpus_and_both_ranks_report(filled: dict[str, Any]) -> None:
    influx = filled["influx"]
    tagged = influx.rows(f'SELECT count("util_gpu_pct") FROM "gpu" WHERE "run" = \'{RUN_ID}\' GROUP BY "gpu"')
    assert {r["gpu"] for r in tagged} == {"0", "1"}
    ranks = influx.rows(f'SELECT count("step_time_s") FROM "train_step" WHERE "run" = \'{RUN_ID}\' GROUP BY "rank"')
    assert {r["rank"] for r in ranks} == {"0", "1"} and all(r["count"] > 10 for r in ranks)


def _by_slug(slug: str) -> dict[str, Any]:
    return next(d for d in dashboards() if d.slug == slug).to_json()


def _simulated_job() -> dict[str, str]:
    """The tags of the simulated Slurm job, which holds GPU 0 of the fixture's two (seed 7)."""
    from gpulse.sources.simulated import SimulatedSource

    tags = SimulatedSource(2, seed=7).job_tags(0)
    assert tags is not None
    return tags


def test_a_job_narrows_the_node_to_its_gpus_and_the_run_to_its_ranks(filled: dict[str, Any]) -> None:
    """The simulated Slurm job holds GPU 0; rank 0 registered GPU 0, so the agent tagged its points with it."""
    influx = filled["influx"]
    job = _simulated_job()["job"]
    node = _by_slug("node")
    every = resolve_variables(influx, node, RECENT, {"host": HOST})
    assert every["job"].values == (job,) and every["gpu"].values == ("0", "1")  # All keeps the GPU no job held
    assert resolve_variables(influx, node, RECENT, {"host": HOST, "job": job})["gpu"].values == ("0",)
    run = _by_slug("training-run")
    assert resolve_variables(influx, run, RECENT, {"run": RUN_ID})["rank"].values == ("0", "1")
    narrowed = resolve_variables(influx, run, RECENT, {"run": RUN_ID, "job": job})
    assert narrowed["job"].values == (job,) and narrowed["rank"].values == ("0",)


def _panel_rows(influx: Any, dash: dict[str, Any], time_from: str, picks: dict[str, str], title: str) -> Any:
    """The rows of the one query of panel ``title``, as Grafana would ask for them."""
    variables = resolve_variables(influx, dash, time_from, picks)
    [q] = [q for p, _t, q in panel_queries(dash, variables, time_from) if p["title"] == title]
    return influx.rows(q, db="gpulse")


def test_the_node_process_table_names_each_process_job(filled: dict[str, Any]) -> None:
    rows = _panel_rows(filled["influx"], _by_slug("node"), RECENT, {"host": HOST}, "Processes")
    jobs = {r["gpu"]: r.get("job") or None for r in rows}
    assert jobs == {"0": _simulated_job()["job"], "1": None}


@pytest.mark.parametrize("tag", list(history.GPU_HOURS_BY))
def test_history_counts_gpu_hours_per_job_user_and_account(filled: dict[str, Any], tag: str) -> None:
    dash = _by_slug("history")
    title = history.GPU_HOURS_TITLES[tag]
    rows = _panel_rows(filled["influx"], dash, dash["time"]["from"], {"host": HOST}, title)
    job = _simulated_job()
    tags = history.GPU_HOURS_BY[tag]
    assert [tuple(r[t] for t in tags) for r in rows] == [tuple(job[t] for t in tags)]  # GPU 1, held by none, left out
    assert rows[0]["GPU-hours"] >= 1 and 0 <= rows[0]["busy GPU-hours"] <= rows[0]["GPU-hours"]


def _copy_into(influx: Any, db: str) -> None:
    """Every raw point of the filled database into ``db`` (made by ``gpulse setup``), then downsampled."""
    from gpulse.influx.setup.v1 import downsample_now

    influx.query(f'SELECT * INTO "{db}"."raw".:MEASUREMENT FROM "gpulse"."raw"./.*/ GROUP BY *', db="gpulse")
    end = time.time_ns()
    downsample_now(Connection(url=influx.url, api="v1", bucket=db), end - 30 * 60 * NS, end + NS)


@pytest.mark.parametrize("dashboard", dashboards(), ids=lambda d: d.slug)
def test_with_another_bucket_name_every_panel_still_returns_data(filled: dict[str, Any], dashboard: Any) -> None:
    """The one rule for the database name: it is the bucket's. Setup maps whatever bucket it is given,
    the datasource's dbName follows it, and no query names the database."""
    influx = filled["influx"]
    if "lab" not in filled:
        _setup(influx.url, "gpulse_lab")
        _copy_into(influx, "gpulse_lab")
        filled["lab"] = OnDatabase(influx, "gpulse_lab")
    dash = dashboard.to_json()
    time_from = dash["time"]["from"] if dashboard.slug == "history" else RECENT
    counts = panel_rows(filled["lab"], dash, time_from, {"host": HOST, "run": RUN_ID})
    assert [t for t, n in counts.items() if n == 0] == []


def _gpu_info_rows(db: Any, dash: dict[str, Any]) -> dict[str, int]:
    """Rows of every target that reads gpu_info, by panel title."""
    variables = resolve_variables(db, dash, RECENT, {"host": HOST})
    return {
        p["title"]: data_rows(db, q) for p, t, q in panel_queries(dash, variables, RECENT) if '"gpu_info"' in t["query"]
    }


def test_gpu_info_panels_keep_their_rows_after_the_raw_retention_dropped_the_agent_start(
    filled: dict[str, Any],
) -> None:
    """A short raw retention (1h, the shortest setup allows) on a copy; the retention passing the
    agent's start is simulated by deleting what it would drop: every gpu_info point of the start.
    The agent repeats gpu_info (every GPU_INFO_EVERY_S; 3 s in this run), so the panels keep rows.
    Deleting the repeats too (the agent before this change) empties them: the test can fail."""
    influx = filled["influx"]
    _setup(influx.url, "gpulse_expired", raw_retention="1h")
    _copy_into(influx, "gpulse_expired")
    db = OnDatabase(influx, "gpulse_expired")
    node_dash = next(d for d in dashboards() if d.uid == "gpulse-node").to_json()
    times = sorted({r["time"] for r in db.rows(f'SELECT "name" FROM "gpu_info" WHERE "host" = \'{HOST}\'')})
    assert len(times) >= 3, f"the agent wrote gpu_info {len(times)} time(s) in {AGENT_SECONDS} s, not every 3 s"
    influx.query(f'DELETE FROM "gpu_info" WHERE time <= {times[0]}', db="gpulse_expired")
    rows = _gpu_info_rows(db, node_dash)
    assert set(rows) == {"GPU inventory", "PCIe link now vs maximum"}
    assert {t: n for t, n in rows.items() if n == 0} == {}
    influx.query(f'DELETE FROM "gpu_info" WHERE time <= {times[-1]}', db="gpulse_expired")
    assert _gpu_info_rows(db, node_dash) == dict.fromkeys(rows, 0)


def test_the_training_dashboard_opens_on_the_latest_run_not_the_alphabetically_first(filled: dict[str, Any]) -> None:
    influx = filled["influx"]
    earlier = filled["start"] - 600 * NS
    influx.write(
        f'train_run,host={HOST},run=aaa-earlier-run,rank=0,local_rank=0,world_size=1 event="start",status="running" {earlier}'
    )
    dash = next(d for d in dashboards() if d.uid == "gpulse-training-run").to_json()
    variables = resolve_variables(influx, dash, "now-3h", {})
    assert variables["run"].values == (RUN_ID,)
    alphabetical = json.loads(json.dumps(dash))
    kept = [v for v in alphabetical["templating"]["list"] if v["name"] in ("raw_retention", "run")]
    alphabetical["templating"]["list"] = kept
    kept[-1]["sort"] = 1  # the old behaviour: Grafana sorts, the first wins
    assert resolve_variables(influx, alphabetical, "now-3h", {})["run"].values == ("aaa-earlier-run",)


def test_a_silent_agent_stays_listed_in_red_whatever_the_time_range(filled: dict[str, Any]) -> None:
    from gpulse.dashboards import agent_health

    influx = filled["influx"]
    now = time.time_ns()
    influx.write("".join(f"agent,host=live-node uptime_s={600 - s}.0 {now - s * NS}\n" for s in (40, 30, 20, 10)))
    dash = agent_health.build().to_json()
    (agents,) = [p for p in dash["panels"] if p["title"] == "Agents"]
    (silent,) = [p for p in dash["panels"] if p["title"] == "Silent agents"]
    variables = resolve_variables(influx, dash, "now-5m", {})  # a range that holds nothing of silent-node
    queries = {t["refId"]: q for p, t, q in panel_queries(dash, variables, "now-5m") if p is agents}
    recent = {r["host"]: r[agent_health.RECENT] for r in influx.rows(queries["B"])}
    assert recent["silent-node"] == 0 and recent["live-node"] >= 3
    last = {r["host"] for r in influx.rows(queries["A"])}
    assert {"silent-node", "live-node"} <= last
    ((_, _, count_q),) = [x for x in panel_queries(dash, variables, "now-5m") if x[0] is silent]
    (row,) = influx.rows(count_q)
    assert row["count_sum"] >= 1
    (column,) = [c for c in agent_health.build().panels()[1].columns if c.name == agent_health.RECENT]
    assert column.thresholds is not None and column.thresholds.base == "red" and column.thresholds.steps[0][0] == 1


def _render(influx: Any, dash: dict[str, Any], time_from: str, picks: dict[str, str]) -> list[dict[str, Any]]:
    variables = resolve_variables(influx, dash, time_from, picks)
    frames: dict[int, list[dict[str, Any]]] = {}
    panels = {p["id"]: p for p in dash["panels"]}
    for p, t, q in panel_queries(dash, variables, time_from):
        frames.setdefault(p["id"], []).extend(backend_frames(influx.query(q, db="gpulse", epoch="ms"), t))
    return grafana("render", [{"panel": panels[i], "frames": f} for i, f in frames.items()])


@pytest.mark.parametrize("built", dashboards(), ids=lambda d: d.slug)
def test_grafana_shows_every_panel_column_of_real_data_in_its_unit(filled: dict[str, Any], built: Any) -> None:
    """Frames built as Grafana's InfluxQL backend builds them, put through each panel's
    transformations by Grafana's own transformers; each field's unit resolved from the panel's
    defaults and overrides with Grafana's field matchers; a real value of each formatted by Grafana's
    formatter must read back as the quantity the column holds, and every column an override names exists."""
    try:
        ensure_installed()
    except RuntimeError as e:
        pytest.fail(str(e))
    dash = built.to_json()
    time_from = dash["time"]["from"] if built.slug == "history" else RECENT
    rendered = {
        r["title"]: r["fields"] for r in _render(filled["influx"], dash, time_from, {"host": HOST, "run": RUN_ID})
    }
    problems: list[str] = []
    shown: list[str] = []
    checked = 0
    for panel, p in zip(
        [p for p in dash["panels"] if p.get("targets")], [p for p in built.panels() if p.queries], strict=True
    ):
        fields = rendered.get(panel["title"], [])
        names = {f["name"] for f in fields}
        for o in panel["fieldConfig"]["overrides"]:
            if o["matcher"]["id"] == "byName" and fields and o["matcher"]["options"] not in names:
                problems.append(f"{p.title}: override for {o['matcher']['options']!r}, columns are {sorted(names)}")
        by_column = {c.name: c.unit for c in p.columns}
        by_ref = {chr(ord("A") + i): q.unit for i, q in enumerate(p.queries)}
        for f in fields:
            unit = by_column.get(f["name"]) or (by_ref.get(f["refId"]) if p.type != "table" else None)
            if f["type"] not in ("number", "time") or f["text"] is None or unit is None:
                if f["type"] == "number" and f["value"] is not None and unit is None and p.type == "table":
                    problems.append(f"{p.title}: numeric column {f['name']!r} has no unit")
                continue
            checked += 1
            if f["unit"] != unit.id:
                problems.append(f"{p.title} / {f['name']}: Grafana resolves unit {f['unit']!r}, not {unit.id!r}")
            elif why := misreads(unit.quantity, f["value"], f["text"]):
                problems.append(f"{p.title} / {f['name']}: {why}")
            else:
                shown.append(f"{p.title} / {f['name']}: {f['value']!r} -> {f['text']}")
    print(f"\n{built.title}: {checked} columns formatted by Grafana\n  " + "\n  ".join(dict.fromkeys(shown)))
    assert problems == []
    assert checked >= (5 if built.uid != alerts.RUNBOOK_UID else 0)


# -- alert rules -------------------------------------------------------------------------------------
Labels = frozenset[tuple[str, str]]


def _series_values(influx: Any, query: str) -> dict[Labels, list[float]]:
    out: dict[Labels, list[float]] = {}
    for res in influx.query(query, db="gpulse").get("results", []):
        for s in res.get("series", []) or []:
            labels = frozenset((s.get("tags") or {}).items())
            out[labels] = [v[1] for v in s["values"] if v[1] is not None]
    return out


_OPS = {"gt": lambda a, b: a > b, "lt": lambda a, b: a < b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}
_COMPARISON = re.compile(r"\s*\$(\w+)\s*([<>])\s*(-?[\d.]+)\s*")


def _math(expression: str, results: dict[str, dict[Labels, float]]) -> dict[Labels, float]:
    """``$a < 10 && $b > 5`` per label set present in every operand (Grafana joins equal label sets)."""
    terms = [_COMPARISON.fullmatch(t) for t in expression.split("&&")]
    assert all(terms), f"math beyond &&-joined comparisons is not modelled here: {expression}"
    common = set.intersection(*(set(results[m.group(1)]) for m in terms if m))
    return {
        labels: float(all(_OPS[m.group(2)](results[m.group(1)][labels], float(m.group(3))) for m in terms if m))
        for labels in common
    }


def evaluate(influx: Any, rule: dict[str, Any]) -> dict[Labels, bool]:
    """What Grafana's alerting would decide for each series of ``rule`` now (True = firing)."""
    results: dict[str, Any] = {}
    for d in rule["data"]:
        model = d["model"]
        if d["datasourceUid"] == DATASOURCE_UID:
            q = interpolate(model["query"], {}, time_from=f"now-{d['relativeTimeRange']['from']}s", interval="1s")
            results[d["refId"]] = _series_values(influx, q)
        elif model["type"] == "reduce":
            assert model["reducer"] == "last" and model["settings"]["mode"] == "dropNN"
            results[d["refId"]] = {k: v[-1] for k, v in results[model["expression"]].items() if v}
        elif model["type"] == "math":
            results[d["refId"]] = _math(model["expression"], results)
        elif model["type"] == "threshold":
            (cond,) = model["conditions"]
            op, (param,) = cond["evaluator"]["type"], cond["evaluator"]["params"]
            results[d["refId"]] = {
                k: _OPS[op](v, param) for k, v in results[model["expression"]].items() if not math.isnan(v)
            }
        else:
            raise AssertionError(f"unmodelled expression type {model['type']}")
    return results[rule["condition"]]


def _firing(decisions: dict[Labels, bool]) -> set[tuple[str, ...]]:
    return {tuple(v for _, v in sorted(labels)) for labels, fire in decisions.items() if fire}


EXPECTED_FIRING = {
    "gpulse-gpu-idle-memory": {("0", "idle-node")},
    "gpulse-gpu-throttled": {("1", HOST)},
    "gpulse-gpu-hot": {("1", HOST)},  # the thermally throttled GPU runs at ~88 °C
    "gpulse-gpu-xid": {("1", HOST)},
    "gpulse-gpu-ecc-uncorrected": {("3", "ecc-node")},
    "gpulse-agent-silent": {("silent-node",)},
    "gpulse-agent-spool-growing": {("spooling-node",)},
    "gpulse-run-finding": {("finding-node", "rank_imbalance", "stuck-run")},
}


@pytest.mark.parametrize("rule", alerts.rules(), ids=lambda r: r["uid"])
def test_an_alert_rule_fires_exactly_for_the_series_in_trouble(filled: dict[str, Any], rule: dict[str, Any]) -> None:
    decisions = evaluate(filled["influx"], rule)
    assert decisions, f"{rule['uid']}: its queries returned no series"
    assert _firing(decisions) == EXPECTED_FIRING[rule["uid"]], json.dumps(
        {"/".join(v for _, v in sorted(k)): f for k, f in decisions.items()}, indent=1
    )
