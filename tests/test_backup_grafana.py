"""``make backup-grafana`` copies the grafana-data volume before Grafana 13's one-way migration.

There is no Docker engine here, so a ``docker`` stand-in on ``PATH`` plays the compose CLI: it logs
each call and, for ``compose run ... tar czf -``, writes a real gzip'd tar of a folder that stands in
for the volume. What is checked is the script's own logic: Grafana is stopped before the copy, the
copy lands complete under ``backups/`` (never a half-written file), an empty copy is refused, and a
restore puts the same files back.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from support.fixtures import REPO

DOCKER = r"""#!/usr/bin/env bash
echo "$*" >> "$DOCKER_LOG"
case "$*" in
  *"--entrypoint tar grafana czf -"*) [ -n "${DOCKER_EMPTY:-}" ] || tar czf - -C "$VOLUME" . ;;
  *"--entrypoint sh grafana"*) mkdir -p "$RESTORED" && tar xzf - -C "$RESTORED" ;;
esac
"""


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "backup-grafana.sh", repo / "scripts")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    volume = tmp_path / "volume"
    (volume / "plugins").mkdir(parents=True)
    (volume / "grafana.db").write_bytes(b"SQLite format 3\x00" + os.urandom(64))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DOCKER_LOG": str(tmp_path / "docker.log"),
        "VOLUME": str(volume),
        "RESTORED": str(tmp_path / "restored"),
    }
    return repo, env


def run(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "scripts/backup-grafana.sh", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_grafana_is_stopped_then_the_whole_volume_is_copied_into_backups(checkout) -> None:
    repo, env = checkout
    r = run(repo, env)
    assert r.returncode == 0, r.stderr
    calls = Path(env["DOCKER_LOG"]).read_text().splitlines()
    assert calls[0] == "compose stop grafana" and "--entrypoint tar grafana czf -" in calls[1]
    [copy] = (repo / "backups").iterdir()
    assert copy.name.startswith("grafana-data-") and copy.suffix == ".tgz"
    with tarfile.open(copy) as tar:
        assert tar.extractfile("./grafana.db").read() == (Path(env["VOLUME"]) / "grafana.db").read_bytes()
    assert f"done: backups/{copy.name}" in r.stdout and "make up" in r.stdout


def test_an_empty_copy_is_refused_and_leaves_no_file(checkout) -> None:
    repo, env = checkout
    r = run(repo, {**env, "DOCKER_EMPTY": "1"})
    assert r.returncode == 1 and "came out empty" in r.stderr
    assert list((repo / "backups").iterdir()) == []


def test_a_restore_puts_the_copy_back_and_refuses_a_missing_file(checkout) -> None:
    repo, env = checkout
    assert run(repo, env).returncode == 0
    [copy] = (repo / "backups").iterdir()
    r = run(repo, env, "restore", f"backups/{copy.name}")
    assert r.returncode == 0, r.stderr
    assert (Path(env["RESTORED"]) / "grafana.db").read_bytes() == (Path(env["VOLUME"]) / "grafana.db").read_bytes()
    missing = run(repo, env, "restore", "backups/none.tgz")
    assert missing.returncode == 2 and "nothing restored" in missing.stderr


def test_without_docker_it_says_there_is_nothing_to_back_up(checkout, tmp_path: Path) -> None:
    repo, env = checkout
    no_docker = tmp_path / "nodocker"
    no_docker.mkdir()
    for tool in ("bash", "dirname", "date", "mkdir", "printf"):
        if found := shutil.which(tool):
            (no_docker / tool).symlink_to(found)
    r = run(repo, {**env, "PATH": str(no_docker)})
    assert r.returncode == 2 and "needs Docker" in r.stderr
    assert not io.StringIO(r.stdout).read()
