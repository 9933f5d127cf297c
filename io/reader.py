"""Reading prompt shards: finding them, checking their schema, streaming their rows.

Owns: the list of input shards of a job (`list_input_shards`), the footer-only schema check of
one shard (`inspect_shard`) and the bounded-memory stream of its rows (`iter_shard_batches`).

Invariants:
- Shards are returned sorted by path and have distinct file names (an output shard is named
  after its input shard, so two inputs with one name would overwrite each other's output).
- A schema problem (missing column, wrong type, unreadable file) raises `InputError` naming
  the file, the column and what was expected. Nulls inside valid columns are not schema
  problems: they become per-row errors downstream.
- Streaming uses ``ParquetFile(pre_buffer=False, buffer_size=1 MiB).iter_batches(use_threads=
  False)`` (notes/toolchain.md §4): memory stays near one batch whatever the file size. Only
  the required columns are read, in `ColumnMap.required_columns` order, and the file is closed
  when the stream ends or is closed.

May import: the standard library and pyarrow. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InputError
from .schema import ColumnMap

__all__ = [
    "InputError",
    "ShardInfo",
    "inspect_shard",
    "iter_shard_batches",
    "list_input_shards",
    "resolve_path",
]

_GLOB_CHARS = frozenset("*?[")
_STREAM_BUFFER_BYTES = 1 << 20


def resolve_path(spec: str, base_dir: Path) -> Path:
    """`spec` (``~`` expanded) made absolute against `base_dir` and normalised; no I/O."""
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    return Path(os.path.normpath(path))


def list_input_shards(spec: str, base_dir: Path) -> list[Path]:
    """The input shards named by `spec`: a folder (its ``*.parquet`` files, not recursive) or
    a glob (``**`` recurses); relative specs resolve against `base_dir`.

    Returns the paths sorted. Raises InputError when nothing matches, the folder does not
    exist, or two shards share a file name.
    """
    resolved = resolve_path(spec, base_dir)
    if _GLOB_CHARS.isdisjoint(spec):
        if not resolved.exists():
            raise InputError(f"input '{spec}' does not exist (resolved to {resolved})")
        if resolved.is_dir():
            paths = [
                p
                for p in resolved.iterdir()
                if p.suffix == ".parquet" and not p.name.startswith(".") and p.is_file()
            ]
            if not paths:
                raise InputError(
                    f"no Parquet files in input folder '{spec}' (resolved to {resolved}); "
                    "expected files named *.parquet"
                )
        else:
            paths = [resolved]
    else:
        pattern = Path(spec).expanduser()
        if not pattern.is_absolute():  # base_dir is a literal path even if it holds '[' or '*'
            pattern = Path(glob.escape(str(base_dir))) / pattern
        found = glob.glob(os.path.normpath(pattern), recursive=True)
        paths = [Path(p) for p in found if os.path.isfile(p)]
        if not paths:
            raise InputError(f"no Parquet files match '{spec}' (resolved to {resolved})")
    paths.sort()
    by_name: dict[str, Path] = {}
    for path in paths:
        other = by_name.setdefault(path.name, path)
        if other != path:
            raise InputError(
                f"input shards {other} and {path} share the file name '{path.name}'; "
                "their output shards would collide: rename one or narrow the input glob"
            )
    return paths


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What the footer of one input shard says: rows, the id type and the passthrough fields."""

    path: Path
    name: str
    num_rows: int
    id_type: pa.DataType
    passthrough: pa.Schema


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _messages_problem(t: pa.DataType) -> str | None:
    """Why `t` is not a list of struct<role: string, content: string>, or None if it is."""
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        return "is not a list"
    item = t.value_type
    if not pa.types.is_struct(item):
        return f"holds {item}, not structs"
    for key in ("role", "content"):
        idx = item.get_field_index(key)
        if idx < 0:
            return f"has no '{key}' field in its structs"
        if not _is_string(item.field(idx).type):
            return f"has '{key}' of type {item.field(idx).type}, not string"
    return None


def _check_column(path: Path, schema: pa.Schema, role: str, name: str) -> pa.Field:
    idx = schema.get_field_index(name)
    if idx < 0:
        raise InputError(
            f"{path}: no column '{name}' (the {role} column); "
            f"the file has columns: {', '.join(schema.names)}"
        )
    return schema.field(idx)


def inspect_shard(path: Path, columns: ColumnMap) -> ShardInfo:
    """Check one shard's schema against `columns`, reading only the Parquet footer.

    Expected types: id an integer or string; prompt a string; messages a list of
    struct<role: string, content: string> (other struct fields allowed); sampling_params a
    struct; passthrough anything. Raises InputError naming the file and the column.
    """
    try:
        with pq.ParquetFile(path) as parquet_file:
            schema = parquet_file.schema_arrow
            num_rows = parquet_file.metadata.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc

    id_field = _check_column(path, schema, "id", columns.id)
    if not (pa.types.is_integer(id_field.type) or _is_string(id_field.type)):
        raise InputError(
            f"{path}: column '{columns.id}' (the id column) has type {id_field.type}; "
            "expected an integer or string type"
        )
    if columns.prompt is not None:
        prompt_field = _check_column(path, schema, "prompt", columns.prompt)
        if not _is_string(prompt_field.type):
            raise InputError(
                f"{path}: column '{columns.prompt}' (the prompt column) has type "
                f"{prompt_field.type}; expected string"
            )
    if columns.messages is not None:
        messages_field = _check_column(path, schema, "messages", columns.messages)
        problem = _messages_problem(messages_field.type)
        if problem is not None:
            raise InputError(
                f"{path}: column '{columns.messages}' (the messages column) has type "
                f"{messages_field.type}, which {problem}; expected a list of "
                "struct<role: string, content: string>"
            )
    if columns.sampling_params is not None:
        sp_field = _check_column(path, schema, "sampling_params", columns.sampling_params)
        if not pa.types.is_struct(sp_field.type):
            raise InputError(
                f"{path}: column '{columns.sampling_params}' (the sampling_params column) has "
                f"type {sp_field.type}; expected a struct of sampling parameters"
            )
    passthrough = pa.schema(
        [_check_column(path, schema, "passthrough", name) for name in columns.passthrough]
    )
    return ShardInfo(
        path=path, name=path.name, num_rows=num_rows, id_type=id_field.type, passthrough=passthrough
    )


def iter_shard_batches(path: Path, columns: ColumnMap, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Yield the shard's rows in file order, `batch_rows` rows per batch (the last may be
    shorter), with only `columns.required_columns`, in that order.

    A plain generator: nothing is opened before the first ``next``; the file closes when the
    generator is exhausted, closed or garbage-collected. A read failure raises InputError
    naming the file and the row where it happened.
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    names = list(columns.required_columns)
    num_rows_read = 0
    try:
        parquet_file = pq.ParquetFile(path, pre_buffer=False, buffer_size=_STREAM_BUFFER_BYTES)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc
    with parquet_file:
        batches = parquet_file.iter_batches(batch_size=batch_rows, columns=names, use_threads=False)
        while True:
            try:
                batch = next(batches, None)
            except (OSError, pa.ArrowException) as exc:
                raise InputError(
                    f"{path}: reading failed after row {num_rows_read} ({exc})"
                ) from exc
            if batch is None:
                return
            num_rows_read += batch.num_rows
            yield batch.select(names)
