"""Which gpulse modules one GPU sample and one training step pass through, hop by hop, per thread.

``docs/architecture.md`` shows the walks; this script measures them (``python trace_walks.py`` from
``bench/`` with the project's venv). Consecutive calls inside one module count as one hop. The GPU
sample: one fast-tier cycle of one GPU (the NVML stand-in under the real ``pynvml``) through the v2
sink to a local server that answers 204. The training step: one step of a ``Run`` on the training
thread, its handling by the run's worker up to the socket, and the agent's receiver up to
``Delivery.submit``.
"""

from __future__ import annotations

import http.server
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent" / "tests"))
sys.setswitchinterval(1000)

_on = False
_calls: dict[int, list[tuple[str, str, str]]] = {}


def _prof(frame, event, arg):  # a profile hook
    if _on and event == "call":
        mod = frame.f_globals.get("__name__", "")
        if mod.startswith("gpulse"):
            t = threading.current_thread()
            _calls.setdefault(t.ident or 0, []).append((mod, frame.f_code.co_name, t.name))


def _report(title: str, threads: tuple[str, ...], until: tuple[str, str] | None = None) -> None:
    """Print the hops of the named threads; a thread's walk ends at its first call of ``until``."""
    print(title)
    total, modules = 0, set()
    for seq in _calls.values():
        if seq[0][2] not in threads:
            continue
        hops: list[tuple[str, str]] = []
        for mod, fn, _ in seq:
            if not hops or hops[-1][0] != mod:
                hops.append((mod, fn))
            if (mod, fn) == until:
                break
        total += len(hops)
        modules |= {m for m, _ in hops}
        print(f"  {seq[0][2]}: {len(hops)} hops, {len({m for m, _ in hops})} modules")
        print("    " + " -> ".join(f"{m.removeprefix('gpulse.')}.{f}" for m, f in hops))
    print(f"  total: {total} hops, {len(modules)} modules, {len(threads)} threads\n")


def _traced(fn, settle: float = 0.0) -> None:
    global _on
    _calls.clear()
    _on = True
    try:
        fn()
        time.sleep(settle)
    finally:
        _on = False


def gpu_sample() -> None:
    from support.fake_pynvml import FakeNvml, h100

    from gpulse.agent.config import AgentConfig
    from gpulse.agent.loop import Agent
    from gpulse.influx.connection import Connection

    FakeNvml.install(None, gpus=[h100(0)])

    class Answer204(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer204)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    conn = Connection(url=f"http://127.0.0.1:{srv.server_port}", api="v2", token="t", token_source="bench")
    cfg = AgentConfig(connection=conn, spool_dir=tempfile.mkdtemp(), no_socket=True, host="n", flush_interval=0.3)
    agent = Agent(cfg)
    agent._gpus = list(agent.source.open())
    agent._start_pipeline()
    agent._rebuild_series()
    ts = time.time_ns() // 10**9 * 10**9
    agent._cycle(ts)  # the first cycle reads every tier and sends the first request
    time.sleep(1.0)
    # the next cycle; the delivery thread cuts it on its timer and the sink's thread sends it
    _traced(lambda: agent._cycle(ts + 10**9), settle=0.35)
    _report(
        "one GPU sample, NVML to the HTTP request",
        ("MainThread", "gpulse-delivery", "gpulse-sink-influx"),
        until=("gpulse.influx.http", "request"),
    )
    agent.delivery.close(2)
    srv.shutdown()


def training_step() -> None:
    from gpulse.channel.server import TrainingReceiver
    from gpulse.training import Run

    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "run", "agent.sock")
    os.makedirs(os.path.dirname(path), mode=0o700)
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(path)
    run = Run(name="walk", output_dir=tmp, socket_path=path, write_report=False)
    with run.step(samples=1, tokens=16):
        with run.phase("forward"):
            pass
    run.log(loss=0.5)
    time.sleep(0.5)  # the worker has sent the start point; the first step waits on the training thread

    def one_step() -> None:
        with run.step(samples=1, tokens=16):  # hands the previous step over
            with run.phase("forward"):
                pass

    _traced(one_step, settle=0.5)  # the worker sends it within its tick
    _report(
        "one training step, training thread and its worker, up to the socket",
        ("MainThread", "gpulse-training"),
        until=("gpulse.channel.endpoint", "send"),
    )
    agent.settimeout(2)
    last = agent.recv(70000)
    agent.setblocking(False)
    try:
        while True:
            last = agent.recv(70000)
    except BlockingIOError:
        pass
    rx = TrainingReceiver(os.path.join(tmp, "rx", "agent.sock"), "h", lambda lines: len(lines))
    rx.handle_datagram(last, None)  # the tag set is known, as for every step after the first
    _traced(lambda: rx.handle_datagram(last, None))
    _report("that step's datagram in the agent, up to Delivery.submit", ("MainThread",))
    run.finish()


if __name__ == "__main__":
    threading.setprofile(_prof)
    sys.setprofile(_prof)
    gpu_sample()
    training_step()
