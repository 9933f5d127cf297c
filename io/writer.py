"""Writing output shards atomically, and checking the output folder.

Owns: the temporary file of each output shard in progress (`OutputShardWriter`), the clean-up
of temporary files a killed run left behind (`clean_temp_files`) and the writability check of
the output folder (`check_output_dir`).

Invariants:
- An output shard exists under its final name whole or not at all: rows go to
  ``out_dir/.{name}.tmp-{pid}-{random}``, which `commit` closes, fsyncs, renames with
  ``os.replace`` and makes durable by fsyncing the folder.
- Temporary names start with a dot and contain ``.tmp-``, so input listings skip them and
  `clean_temp_files` finds them. Two runs must not share an output folder.
- A writer is used once: after `commit` or `abort` it accepts nothing more.

May import: the standard library and pyarrow. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from collections.abc import Collection
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InputError

__all__ = [
    "REPORT_NAME",
    "SUMMARY_NAME",
    "TIMELINE_NAME",
    "OutputShardWriter",
    "check_output_dir",
    "clean_temp_files",
    "find_temp_files",
    "fsync_path",
    "new_temp_path",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_parquet_atomic",
]

# Side files of a job beside its output shards (the manifest is MANIFEST_NAME in manifest.py).
SUMMARY_NAME = "summary.json"
TIMELINE_NAME = "timeline.parquet"
REPORT_NAME = "report.html"

_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.tmp-\d+-[0-9a-f]+")


def new_temp_path(out_dir: Path, name: str) -> Path:
    """A fresh temporary path in `out_dir` for a file that will be renamed to `name`."""
    return out_dir / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def fsync_path(path: Path) -> None:
    """fsync a file (its data) or a folder (renames and deletions inside it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: object) -> None:
    """Replace `path` with `data` as JSON, atomically and durably: temporary file, fsync,
    rename, fsync of the folder. Raises ValueError if `data` is not JSON-able (NaN included),
    OSError if it cannot be written; no temporary file is left either way."""
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    temp = new_temp_path(path.parent, path.name)
    try:
        with temp.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, atomically and durably (temporary file, fsync, rename, fsync
    of the folder). Raises OSError if it cannot be written; no temporary file is left."""
    temp = new_temp_path(path.parent, path.name)
    try:
        with temp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def write_parquet_atomic(path: Path, table: pa.Table) -> None:
    """Replace `path` with `table` as one Parquet file, atomically and durably (temporary file,
    fsync, rename, fsync of the folder), for small side files such as ``timeline.parquet``.
    Raises OSError / pyarrow errors if it cannot be written; no temporary file is left."""
    temp = new_temp_path(path.parent, path.name)
    try:
        pq.write_table(table, temp, compression="zstd")
        fsync_path(temp)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


class OutputShardWriter:
    """One output shard being written: rows go to a temporary file until `commit`.

    Use as a context manager: leaving the block without a commit (normally or by an
    exception) aborts, so no temporary file is left behind.
    """

    def __init__(self, out_dir: Path, shard_name: str, schema: pa.Schema) -> None:
        if not shard_name or Path(shard_name).name != shard_name or shard_name.startswith("."):
            raise ValueError(f"shard_name must be a plain file name, got {shard_name!r}")
        self._final_path = out_dir / shard_name
        self._temp_path = new_temp_path(out_dir, shard_name)
        self._schema = schema
        self._num_rows = 0
        self._is_done = False
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            self._temp_path, schema, compression="zstd"
        )

    @property
    def final_path(self) -> Path:
        return self._final_path

    @property
    def temp_path(self) -> Path:
        return self._temp_path

    @property
    def num_rows(self) -> int:
        """Rows written so far."""
        return self._num_rows

    def write(self, batch: pa.RecordBatch) -> None:
        """Append a batch (its schema must equal the writer's). Raises ValueError after
        commit/abort or on a schema mismatch."""
        if self._writer is None or self._is_done:
            raise ValueError(f"output shard {self._final_path} is already committed or aborted")
        if not batch.schema.equals(self._schema):
            raise ValueError(
                f"output shard {self._final_path}: batch schema differs from the shard's:\n"
                f"{batch.schema}\nexpected:\n{self._schema}"
            )
        self._writer.write_batch(batch)
        self._num_rows += batch.num_rows

    def commit(self) -> Path:
        """Close, fsync, rename to the final name and fsync the folder; return the final path.

        On failure the temporary file is removed and the exception propagates.
        """
        if self._writer is None or self._is_done:
            raise ValueError(f"output shard {self._final_path} is already committed or aborted")
        try:
            writer, self._writer = self._writer, None
            writer.close()
            fsync_path(self._temp_path)
            os.replace(self._temp_path, self._final_path)
            self._is_done = True
            fsync_path(self._final_path.parent)
        except BaseException:
            if not self._is_done:
                self.abort()
            raise
        return self._final_path

    def abort(self) -> None:
        """Close and delete the temporary file. Idempotent; a no-op after commit."""
        if self._is_done:
            return
        self._is_done = True
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                writer.close()
        finally:
            self._temp_path.unlink(missing_ok=True)

    def __enter__(self) -> OutputShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()


def find_temp_files(out_dir: Path, names: Collection[str] | None = None) -> list[Path]:
    """The temporary files in `out_dir` (``.{name}.tmp-{pid}-{hex}``, as `new_temp_path` makes
    them), sorted; with `names`, only those of these final names, matched exactly (glob
    characters in a name match themselves only). A missing folder holds none."""
    if not out_dir.is_dir():
        return []
    found = []
    for path in sorted(out_dir.iterdir()):
        match = _TEMP_NAME.fullmatch(path.name)
        if match is not None and (names is None or match.group("name") in names):
            found.append(path)
    return found


def clean_temp_files(out_dir: Path, names: Collection[str] | None = None) -> int:
    """Delete the temporary files a killed run left in `out_dir` (`find_temp_files`; with
    `names`, only theirs: a folder shared by several jobs, each cleans its own); return how
    many. Only regular files are deleted, never through a symbolic link."""
    removed = 0
    for path in find_temp_files(out_dir, names):
        if stat.S_ISREG(os.lstat(path).st_mode):
            path.unlink(missing_ok=True)
            removed += 1
    if removed:
        fsync_path(out_dir)
    return removed


def check_output_dir(out_dir: Path) -> None:
    """Create `out_dir` (and its parents) if missing and check that files can be created in it.

    Raises InputError naming the folder when it cannot be created, is not a folder or is not
    writable.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise InputError(f"output folder {out_dir} exists and is not a folder") from exc
    except OSError as exc:
        raise InputError(f"cannot create output folder {out_dir}: {exc.strerror or exc}") from exc
    probe = new_temp_path(out_dir, "write-probe")
    try:
        probe.open("xb").close()
        probe.unlink()
    except OSError as exc:
        raise InputError(f"output folder {out_dir} is not writable: {exc.strerror or exc}") from exc
