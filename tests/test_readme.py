"""Every command in the README runs, in the README's order, as a reader would type it.

Fenced blocks marked ``runnable`` (```` ```bash runnable id=NAME ````) are executed: bash blocks with
``bash -euo pipefail`` in one working directory, Python blocks as programs, TOML blocks are written to
``gpulse.toml`` (the file the next block reads). The two first-screen commands (``make up``,
``make test``) are not marked: tests/test_up.py and tests/test_fresh_clone.py cover them.

What stands in for what a reader has:

* the stack ``make up`` starts -> a real InfluxDB 1.x (Debian's ``influxd``) with authentication,
  reached through ``GPULSE_URL``/``GPULSE_API=v1``, as the README tells readers with another server
  to do; ``secrets/influxdb-admin-token`` holds its admin's ``user:password``;
* the GPUs -> :class:`FakeNvml` (the NVML boundary behind the real ``pynvml``: two H100s), installed
  by a ``sitecustomize`` module in every Python process the blocks start;
* ms-swift (not installed: it pulls modelscope) -> a ``swift`` command that does what ``swift sft``
  does with ``--external_plugins``/``--callbacks`` (ms-swift 4.6.0's plugin import and
  ``callbacks_map`` lookup, from agent/tests/training/test_training_hf.py) and trains the tiny model of
  that test instead of downloading the one named;
* the training snippets talk to a real ``gpulse agent`` (simulated GPUs) that writes to the same
  InfluxDB; each must leave a new run with its steps there.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.fixtures import REPO, gpulse_cmd
from support.influxd import InfluxDB1

pytestmark = [pytest.mark.influxdb, pytest.mark.slow]  # training snippets and agents: minutes, not for the fast lane

README = REPO / "README.md"
_FENCE = re.compile(r"^```(?P<lang>\w+)(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    id: str
    body: str
    line: int


def readme_blocks() -> tuple[list[Block], list[tuple[str, str, int]]]:
    """(runnable blocks, other fenced blocks as (lang, first line, line number))."""
    text = README.read_text(encoding="utf-8")
    runnable, other = [], []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        info = m.group("info").split()
        if "runnable" in info:
            ids = [w.split("=", 1)[1] for w in info if w.startswith("id=")]
            assert ids, f"README.md:{line}: a runnable block needs id=NAME"
            runnable.append(Block(m.group("lang"), ids[0], m.group("body"), line))
        else:
            other.append(
                (m.group("lang"), m.group("body").strip().splitlines()[0] if m.group("body").strip() else "", line)
            )
    return runnable, other


BLOCKS, OTHER = readme_blocks()

SITECUSTOMIZE = """\
import sys
sys.path.insert(0, {tests!r})
from support.fake_pynvml import FakeNvml, h100
FakeNvml.install(None, gpus=[h100(0), h100(1)])
"""

SWIFT = """\
#!{python}
\"\"\"Stand-in for ms-swift's `swift sft`: --external_plugins and --callbacks as ms-swift 4.6.0 handles them.\"\"\"
import argparse, pathlib, sys, tempfile
sys.path[:0] = [{tests!r}, {tests!r} + "/training"]
from test_training_hf import SWIFT_CALLBACKS, SlowTokens, SwiftLikeTrainer, import_external_file, tiny_model, training_args

pkg = pathlib.Path(tempfile.mkdtemp()) / "swift"
(pkg / "callbacks").mkdir(parents=True)
(pkg / "__init__.py").write_text("")
(pkg / "callbacks" / "__init__.py").write_text(SWIFT_CALLBACKS)
sys.path.insert(0, str(pkg.parent))
p = argparse.ArgumentParser()
p.add_argument("command", choices=["sft"])
p.add_argument("--external_plugins", nargs="+", default=[])
p.add_argument("--callbacks", nargs="+", default=[])
p.add_argument("--output_dir", default="output")
args, _model_and_data = p.parse_known_args()
for plugin in args.external_plugins:
    import_external_file(plugin)
trainer = SwiftLikeTrainer(model=tiny_model(), args=training_args(pathlib.Path(args.output_dir)),
                           train_dataset=SlowTokens(), callback_names=args.callbacks)
trainer.train()
"""


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A reader's shell: working directory, environment, the database, and an agent for the training snippets."""
    root = tmp_path_factory.mktemp("readme")
    server = InfluxDB1(root / "influxd", auth=True).start()
    password = secrets.token_urlsafe(16)
    server.query(f"CREATE USER admin WITH PASSWORD '{password}' WITH ALL PRIVILEGES")
    work = root / "work"
    (work / "secrets").mkdir(parents=True)
    token = work / "secrets" / "influxdb-admin-token"
    token.write_text(f"admin:{password}\n")
    token.chmod(0o600)
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(tests=str(REPO / "agent" / "tests")))
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "swift").write_text(SWIFT.format(python=sys.executable, tests=str(REPO / "agent" / "tests")))
    (bin_dir / "swift").chmod(0o755)
    (root / "run").mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULSE_", "PYTEST_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{bin_dir}:{os.environ['PATH']}",
        # the site module first, then the caller's path: the blocks run the gpulse under test
        PYTHONPATH=os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p),
        GPULSE_URL=server.url,
        GPULSE_API="v1",
        XDG_RUNTIME_DIR=str(root / "run"),
        XDG_STATE_HOME=str(root / "state"),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    sock = root / "training-agent.sock"
    agent = subprocess.Popen(
        gpulse_cmd("agent", "--simulate", "1", "--socket", str(sock), "--token-file", str(token), "--flush-interval", "0.2",
                   "--host", "readme-training-node", "--spool-dir", str(root / "agent-spool")),
        env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=open(root / "agent.log", "w"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sock.exists(), (root / "agent.log").read_text()
        yield {
            "server": server,
            "root": root,
            "work": work,
            "env": env,
            "socket": str(sock),
            "token": token,
            "creds": ("admin", password),
        }
    finally:
        agent.terminate()
        agent.wait(30)
        server.stop()


def _rows(reader: dict, q: str) -> list[dict]:
    """InfluxQL as the admin, through gpulse's own client (Basic auth, as every gpulse command sends it)."""
    from gpulse.influx.connection import Connection
    from gpulse.influx.query import InfluxQL

    user, password = reader["creds"]
    return InfluxQL(Connection(url=reader["server"].url, api="v1", token=f"{user}:{password}")).rows(q)


def _runs(reader: dict) -> set[str]:
    """The run ids with steps in the database (none before the README's setup block created it)."""
    from gpulse.influx.query import QueryError

    try:
        return {row["value"] for row in _rows(reader, 'SHOW TAG VALUES FROM "train_step" WITH KEY = "run"')}
    except QueryError as e:
        if "database not found" in str(e):
            return set()
        raise


def test_every_bash_or_python_block_is_marked_runnable_except_the_first_screen_commands() -> None:
    unmarked = [(lang, first, line) for lang, first, line in OTHER if lang in ("bash", "sh", "python", "toml")]
    assert [first for _, first, _ in unmarked] == [
        "make up     # InfluxDB 2 + Grafana in Docker, then the agent on this machine's GPUs"
    ], unmarked
    ids = [b.id for b in BLOCKS]
    assert len(ids) == len(set(ids))
    assert {"hf", "swift", "lightning", "pytorch"} <= set(ids), "every integration's snippet must run"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_a_readme_block_runs(reader: dict, block: Block) -> None:
    work, env = reader["work"], dict(reader["env"])
    if block.lang == "toml":
        (work / "gpulse.toml").write_text(block.body)
        from gpulse.agent.config import load_toml

        load_toml(work / "gpulse.toml")  # every key exists and the token is not in it
        return
    before = _runs(reader)
    if block.lang == "python":
        script = reader["root"] / f"readme_{block.id}.py"  # the test's file, not the reader's: outside work
        script.write_text(block.body)
        env["GPULSE_SOCKET"] = reader["socket"]
        cmd = [sys.executable, str(script)]
    else:
        assert block.lang == "bash", block
        if block.id == "swift":
            env["GPULSE_SOCKET"] = reader["socket"]
        if block.id == "nodes":
            # the TOML names the reader's server and files; here the environment (which wins) points at the test's
            env.update(GPULSE_TOKEN_FILE=str(reader["token"]), GPULSE_SPOOL_DIR=str(reader["root"] / "spool"))
        cmd = ["bash", "-euo", "pipefail", "-c", block.body]
    out = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=240, check=False)
    text = out.stdout + out.stderr
    where = f"README.md:{block.line} ({block.id})\n{text[-4000:]}"
    if block.id == "doctor":
        for check in ("gpus", "database", "token", "layout", "downsampling", "clock", "socket", "spool"):
            assert re.search(rf"^✔ {check}:", out.stdout, re.M), (check, where)
        assert "2 GPU(s) via NVML" in out.stdout
        assert out.returncode == (1 if "✘" in out.stdout else 0), where  # containers depend on the machine
        return
    assert out.returncode == 0, where
    if block.lang == "python" or block.id == "swift":
        deadline = time.monotonic() + 15
        while not (new := _runs(reader) - before) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert len(new) == 1, (new, where)
        (run,) = new
        steps = _rows(reader, f'SELECT count("step_time_s") FROM "train_step" WHERE "run" = \'{run}\'')
        assert steps and steps[0]["count"] >= 4, (steps, where)
    elif block.id == "setup":
        assert "DIAGNOSIS:" in out.stdout and (work / "out" / "demo-report" / "metrics_report.html").exists(), where
    elif block.id == "agent":
        assert "GPUs:" in out.stdout and "NVIDIA H100" in out.stdout, where  # `gpulse status` answered
    elif block.id == "record":
        assert (work / "out" / "node.lp").stat().st_size > 0
        assert "a node report" in out.stdout and (work / "out" / "node-report" / "node_report.json").exists(), where
        assert re.search(r"\buploaded \d+ lines", text), where
    elif block.id == "nodes":
        assert "checks passed" in out.stdout, where
    elif block.id == "report":
        assert "DIAGNOSIS:" in out.stdout and (work / "out" / "report" / "metrics_report.html").exists(), where


NO_GPU_BLOCKS = ("agent", "record", "doctor", "nodes")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.id in NO_GPU_BLOCKS], ids=lambda b: b.id)
def test_without_a_gpu_the_agent_blocks_run_as_written_after_the_readme_s_one_line(reader: dict, block: Block) -> None:
    """Issue 14 item 5: on a machine without a GPU the README's agent and record blocks failed as
    written (exit 3). The README's no-GPU line is ``export GPULSE_SIMULATE=8``; with it, and no
    NVIDIA driver at all (this machine's real pynvml, no stand-in), every agent block runs."""
    assert "`export GPULSE_SIMULATE=8`" in README.read_text(encoding="utf-8")
    work, env = reader["work"], dict(reader["env"], GPULSE_SIMULATE="8")
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # no FakeNvml: the real pynvml finds no driver here
    if block.id == "nodes":
        env.update(GPULSE_TOKEN_FILE=str(reader["token"]), GPULSE_SPOOL_DIR=str(reader["root"] / "spool"))
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.body], cwd=work, env=env, capture_output=True, text=True, timeout=240
    )
    where = f"README.md:{block.line} ({block.id}, no GPU)\n{(out.stdout + out.stderr)[-4000:]}"
    if block.id == "doctor":
        assert re.search(r"^✔ gpus: 8 GPU\(s\) via simulated", out.stdout, re.M), where
        assert out.returncode == (1 if "✘" in out.stdout else 0), where
        return
    assert out.returncode == 0, where
    if block.id == "agent":
        assert "simulated H100" in out.stdout and "GPUs:" in out.stdout, where


def test_the_readme_s_commands_leave_the_checkout_clean_but_for_out(reader: dict) -> None:
    """Runs after the blocks (pytest keeps the file's order). Before: they left ``demo-report/``,
    ``report/`` and ``metrics_report.json`` beside the reader's checkout files. What may be there:
    ``secrets/`` (``make up``), ``gpulse.toml`` (the README has the reader write it) and ``out/``
    (git-ignored, where every command of the README writes)."""
    assert {p.name for p in reader["work"].iterdir()} <= {"secrets", "gpulse.toml", "out"}
