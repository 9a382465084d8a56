"""Durable appends and private directories: the one way every stage writes what must survive or stay private."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from gpulse.util import files


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_an_append_is_all_on_disk_or_none_of_it(tmp_path, monkeypatch):
    path = tmp_path / "f.lp"
    fd = files.open_append(path)
    try:
        files.append_fsync(fd, b"a 1\n")
        real = files.write_all

        def half_then_full(fd, data):
            real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(files, "write_all", half_then_full)
        with pytest.raises(OSError) as e:
            files.append_fsync(fd, b"b 2\nc 3\n")
        assert e.value.errno == errno.ENOSPC and not isinstance(e.value, files.TornAppend)
        assert path.read_bytes() == b"a 1\n"  # the half record was cut away
        monkeypatch.setattr(files, "write_all", real)
        files.append_fsync(fd, b"d 4\n")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"a 1\nd 4\n" and mode(path) == 0o600


def test_a_failed_append_that_cannot_be_cut_back_says_so(tmp_path, monkeypatch):
    fd = files.open_append(tmp_path / "f")

    def part_then_eio(fd, data):
        os.write(fd, data[:3])
        raise OSError(errno.EIO, "I/O error")

    def no_truncate(fd, size):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(files, "write_all", part_then_eio)
    monkeypatch.setattr(files.os, "ftruncate", no_truncate)
    try:
        with pytest.raises(files.TornAppend):
            files.append_fsync(fd, b"abcdef\n")
    finally:
        os.close(fd)


def test_a_private_directory_is_created_0700_and_an_open_one_of_ours_is_tightened(tmp_path):
    new = files.private_dir(tmp_path / "a" / "b")
    assert mode(new) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    files.private_dir(loose)
    assert mode(loose) == 0o700
    grouped = tmp_path / "grouped"
    files.private_dir(grouped, 0o750)
    os.chmod(grouped, 0o770)
    files.private_dir(grouped, 0o750)
    assert mode(grouped) == 0o750


def test_a_directory_of_another_user_is_refused_unless_it_is_only_a_parent(foreign_dir):
    with pytest.raises(PermissionError, match="uid 12345"):
        files.private_dir(foreign_dir)
    files.private_dir(foreign_dir, must_own=False)
    assert mode(foreign_dir) == 0o755 and os.stat(foreign_dir).st_uid == 12345  # left alone
