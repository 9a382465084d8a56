"""Run the real ``gpulse agent`` as a subprocess in tests, and read its final counts (``--summary-file``)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.fixtures import gpulse_cmd
from support.influxd import InfluxDB1


class AgentProc:
    """``gpulse agent ARGS`` with stderr captured to a file (tests grep it and parse the summary)."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        workdir: Path,
        name: str = "agent",
        *,
        verbose: bool = False,
        prefix: Sequence[str] = (),
    ) -> None:
        """``prefix``: a command that execs the agent in the same process (e.g. ``unshare ...``)."""
        self.args = args
        self.stderr_path = workdir / f"{name}.stderr"
        self.summary_path = workdir / f"{name}.summary.json"
        self._err = open(self.stderr_path, "wb")
        cmd = [
            *prefix,
            *gpulse_cmd(*(["-v"] if verbose else []), "agent", *args, "--summary-file", str(self.summary_path)),
        ]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=self._err)
        self.pid = self.proc.pid

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.alive():
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.alive():
                self.proc.kill()
                self.proc.wait()
            self._err.close()
        return rc

    def summary(self) -> dict[str, Any]:
        """The final counts the agent wrote at exit."""
        if not self.summary_path.exists():
            raise AssertionError(f"no final summary from the agent; its stderr:\n{self.stderr[-3000:]}")
        return json.loads(self.summary_path.read_text())  # type: ignore[no-any-return]


def points_in(server: InfluxDB1, measurement: str, where: str = "") -> int:
    """Points of a measurement: the largest per-field count (every point has its measurement's core field)."""
    w = f" WHERE {where}" if where else ""
    rows = server.rows(f'SELECT count(*) FROM "{measurement}"{w}')
    return (
        max((int(v) for k, v in rows[0].items() if k.startswith("count_") and v is not None), default=0) if rows else 0
    )


def gpu_timestamps(server: InfluxDB1, gpu: str = "0") -> list[int]:
    rows = server.rows(f"SELECT util_gpu_pct FROM gpu WHERE gpu = '{gpu}'")
    return sorted(int(r["time"]) for r in rows)


def agent_args(server: InfluxDB1, *extra: str, gpus: int = 8, interval: float = 0.2) -> list[str]:
    """The flags the real-server tests share: simulated GPUs, v1 API, no training socket."""
    return [
        "--simulate",
        str(gpus),
        "--interval",
        str(interval),
        "--api",
        "v1",
        "--url",
        server.url,
        "--bucket",
        "gpulse",
        "--no-socket",
        *extra,
    ]
