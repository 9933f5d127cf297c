"""The exclusive lock of an output folder: one job run at a time per folder.

Owns: ``.batchgen.lock`` in the output folder and the `fcntl.flock` held on it for a whole run
(`OutputLock`).

Invariants:
- While a run holds the lock, no other run (in this or another process) can take it: the
  second gets an `InputError` naming the folder and the holder's pid, before it deletes or
  writes anything.
- The kernel drops a `flock` when its holder dies (``kill -9`` included), so a lock left by a
  dead process is simply taken over; the file itself stays (deleting it would race with a run
  that has just opened it).
- The lock file's name starts with a dot and has no ``.tmp-``: neither input listings nor
  `clean_temp_files` touch it.

May import: the standard library only.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from .errors import InputError

__all__ = ["LOCK_NAME", "OutputLock"]

LOCK_NAME = ".batchgen.lock"


class OutputLock:
    """An exclusive, non-blocking lock on `out_dir` (which must exist); use as a context
    manager or call `acquire` / `release`."""

    def __init__(self, out_dir: Path) -> None:
        self._path = out_dir / LOCK_NAME
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self._path

    @property
    def is_held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock and write this process's pid into the lock file. Raises InputError
        naming the folder (and the holder's pid when known) if another run holds it, or if
        the lock file cannot be opened."""
        if self._fd is not None:
            raise ValueError(f"{self._path} is already held by this object")
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise InputError(
                f"cannot open the lock file {self._path}: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder is not None else "another process"
            raise InputError(
                f"output folder {self._path.parent} is in use by another batchgen run ({who} "
                f"holds {self._path}); wait for it to finish or use another output folder"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise InputError(f"cannot lock {self._path}: {exc.strerror or exc}") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (idempotent). The file stays."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
