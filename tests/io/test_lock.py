"""The output folder's lock: exclusive, names its holder, released on close and on death."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batchgen.io import LOCK_NAME, InputError, OutputLock


def test_second_lock_is_refused_naming_the_holder_pid(tmp_path: Path) -> None:
    with OutputLock(tmp_path) as first:
        assert first.is_held
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        second = OutputLock(tmp_path)
        with pytest.raises(InputError, match=rf"{tmp_path} is in use .*pid {os.getpid()}"):
            second.acquire()
        assert not second.is_held
    # released on exit: a new lock is taken at once
    with OutputLock(tmp_path) as third:
        assert third.is_held


def test_lock_file_holding_a_stale_pid_is_taken_over(tmp_path: Path) -> None:
    # What a kill -9'd holder leaves: the file with its pid, but no flock (the kernel dropped it).
    (tmp_path / LOCK_NAME).write_text("999999999\n")
    with OutputLock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"


def test_release_is_idempotent_and_the_file_stays(tmp_path: Path) -> None:
    lock = OutputLock(tmp_path)
    lock.acquire()
    lock.release()
    lock.release()
    assert not lock.is_held
    assert (tmp_path / LOCK_NAME).is_file()


def test_unopenable_lock_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot open the lock file"):
        OutputLock(tmp_path / "missing-folder").acquire()


# --- hostile lock files (issue 20, defect 3): the lock never writes into another file ----------


def test_a_symlinked_lock_file_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("user data\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(target)
    with pytest.raises(InputError, match="symbolic link"):
        OutputLock(out).acquire()
    assert target.read_text() == "user data\n"  # truncated and overwritten with a pid before


def test_a_dangling_symlink_is_not_followed_to_create_its_target(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(tmp_path / "created-elsewhere")
    with pytest.raises(InputError, match="symbolic link"):
        OutputLock(out).acquire()
    assert not (tmp_path / "created-elsewhere").exists()


def test_a_hard_linked_lock_file_is_refused_and_the_other_name_kept(tmp_path: Path) -> None:
    other = tmp_path / "other.txt"
    other.write_text("user data\n")
    out = tmp_path / "out"
    out.mkdir()
    os.link(other, out / LOCK_NAME)
    with pytest.raises(InputError, match="hard-linked"):
        OutputLock(out).acquire()
    assert other.read_text() == "user data\n"


def test_a_fifo_in_place_of_the_lock_file_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / LOCK_NAME)
    with pytest.raises(InputError, match="not a regular file"):
        OutputLock(tmp_path).acquire()
