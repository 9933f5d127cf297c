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
