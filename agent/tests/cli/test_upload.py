"""``gpulse upload`` pushes recordings into a real InfluxDB 1.x: validated, idempotent, and honest about bad lines."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from support.fixtures import gpulse_cmd

from gpulse.lineprotocol.encode import Encoder

TAGS = {"run": "up1", "rank": "0", "local_rank": "0", "world_size": "1", "host": "node1"}


def recording(n: int, run: str = "up1", t0: int | None = None) -> str:
    enc = Encoder()
    t0 = t0 or time.time_ns() - 10**9 * 60
    lines = [
        enc.encode(
            "train_step",
            {**TAGS, "run": run},
            {"step": i, "step_time_s": 0.1, "log_loss": 1.0 / (i + 1)},
            t0 + i * 10**6,
        )
        for i in range(n)
    ]
    lines.append(
        enc.encode(
            "gpu",
            {"host": "node1", "gpu": "0", "uuid": "GPU-0", "model": "Sim", "run": run},
            {"util_gpu_pct": 50.0},
            t0,
        )
    )
    return "".join(lines)


def upload(influxdb, clean_env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        gpulse_cmd("upload", "--url", influxdb.url, "--api", "v1", "--bucket", "gpulse", *args),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_uploading_the_same_file_twice_creates_no_duplicates(tmp_path: Path, influxdb_module, clean_env):
    f = tmp_path / "gpulse-records.lp"
    f.write_text(recording(250))
    for _ in range(2):
        res = upload(influxdb_module, clean_env, str(f))
        assert res.returncode == 0, res.stderr
        assert "uploaded 251 lines" in res.stdout and "0 invalid" in res.stdout
    assert influxdb_module.count("train_step", "step", where="\"run\" = 'up1'") == 250
    assert influxdb_module.count("gpu", "util_gpu_pct", where="\"run\" = 'up1'") == 1


def test_bad_lines_are_named_by_line_number_and_never_sent(tmp_path: Path, influxdb_module, clean_env):
    good = recording(3, run="up2").splitlines(keepends=True)
    f = tmp_path / "mixed.lp"
    f.write_text(
        good[0]
        + "train_step,host=h,run=up2,rank=0 step=1.5 1\n"  # float for the int field step
        + "nonsense here\n"
        + good[1]
        + "train_step,host=h,run=up2,rank=0 step=7i\n"  # no timestamp: would duplicate on re-upload
        + "mystery,host=h value=1 1\n"
        + good[2]
        + good[3]
        + "train_step,host=h,run=up2,rank=0 step=9i 17"  # torn last line (no newline)
    )
    res = upload(influxdb_module, clean_env, str(f))
    assert res.returncode == 3, res.stderr
    reported = {int(line.split(":")[1]): line for line in res.stderr.splitlines() if line.startswith(f"{f}:")}
    expected = {
        2: "'step' is float, the schema says int",
        3: "no '='",
        5: "no timestamp",
        6: "unknown measurement",
        9: "no newline",
    }
    assert sorted(reported) == sorted(expected)
    for lineno, why in expected.items():
        assert why in reported[lineno]
    assert "uploaded 4 lines" in res.stdout and "5 invalid lines skipped" in res.stdout
    assert influxdb_module.count("train_step", "step", where="\"run\" = 'up2'") == 3
    assert influxdb_module.count("mystery", "value") == 0


def test_dry_run_checks_without_sending(tmp_path: Path, influxdb_module, clean_env):
    f = tmp_path / "dry.lp"
    f.write_text(recording(5, run="up3"))
    res = upload(influxdb_module, clean_env, "--dry-run", str(f))
    assert res.returncode == 0 and "6 valid lines, 0 invalid" in res.stdout
    assert influxdb_module.count("train_step", "step", where="\"run\" = 'up3'") == 0


def test_an_unreachable_database_fails_with_status_1_and_a_missing_file_is_a_config_error(tmp_path: Path, clean_env):
    f = tmp_path / "r.lp"
    f.write_text(recording(2, run="up4"))
    res = subprocess.run(
        gpulse_cmd("upload", "--url", "http://127.0.0.1:9", "--api", "v1", "--deadline", "1", str(f)),
        env=clean_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 1 and "3 not delivered" in res.stdout
    res = subprocess.run(
        gpulse_cmd("upload", str(tmp_path / "nope.lp")), env=clean_env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "is not a file" in res.stderr
