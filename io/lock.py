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
- Only a regular file of our own is ever truncated and written: the lock is opened with
  ``O_NOFOLLOW`` (a symbolic link in its place is refused, never followed to its target) and
  refused when it is not a regular file or has other hard links (writing the pid would change
  another file's contents).

May import: the standard library only.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from types import TracebackType

from .errors import InputError

__all__ = ["LOCK_NAME", "OutputLock"]

LOCK_NAME = ".batchgen.lock"


class OutputLock:
    """An exclusive, non-blocking lock on `out_dir` (which must exist), held on the file
    `name` in it; use as a context manager or call `acquire` / `release`."""

    def __init__(self, out_dir: Path, name: str = LOCK_NAME) -> None:
        self._path = out_dir / name
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
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self._path, flags, 0o644)
        except OSError as exc:
            if os.path.islink(self._path):
                raise InputError(
                    f"the lock file {self._path} is a symbolic link; batchgen never writes through "
                    "one: remove it (or use another output folder)"
                ) from exc
            raise InputError(
                f"cannot open the lock file {self._path}: {exc.strerror or exc}"
            ) from exc
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            what = "not a regular file" if not stat.S_ISREG(info.st_mode) else "hard-linked to another name"
            raise InputError(
                f"the lock file {self._path} is {what}; batchgen writes only a lock file of its own: "
                "remove it (or use another output folder)"
            )
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
