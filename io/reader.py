"""Reading prompt shards: finding them, checking their schema, streaming their rows.

Owns: the footer-only schema check of one shard with its identity (`inspect_shard`,
`ShardInfo.identity`: size and footer sha256) and the bounded-memory stream of its rows
(`iter_shard_batches`); finding the shards and checking the output folder against them is
`batchgen.io.listing` (re-exported here).

Invariants:
- A schema problem (missing column, wrong type) raises `InputError` naming the file, the
  column and what was expected; an unreadable file raises `ShardReadError` (an InputError that
  ``on_bad_shard: skip`` may skip). Nulls inside valid columns are not schema
  problems: they become per-row errors downstream.
- Streaming uses ``ParquetFile(pre_buffer=False, buffer_size=1 MiB).iter_batches(use_threads=
  False)`` (notes/toolchain.md §4): memory stays near one batch whatever the file size. Only
  the required columns are read, in `ColumnMap.required_columns` order, and the file is closed
  when the stream ends or is closed.

May import: the standard library and pyarrow. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InputChangedError, InputError, ShardReadError
from .identity import InputIdentity
from .listing import (
    InputShard,
    check_output_outside_inputs,
    find_input_shards,
    hive_partitions,
    list_input_shards,
    resolve_path,
    shard_name,
)
from .schema import ColumnMap

__all__ = [
    "InputChangedError",
    "InputError",
    "InputShard",
    "ShardInfo",
    "ShardReadError",
    "check_output_outside_inputs",
    "check_unchanged",
    "find_input_shards",
    "hive_partitions",
    "inspect_shard",
    "iter_shard_batches",
    "list_input_shards",
    "plain_type",
    "resolve_path",
    "shard_name",
]

_STREAM_BUFFER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What the footer of one input shard says: rows, the id type and the passthrough fields,
    plus the file's identity: its size in bytes and the sha256 of its Parquet footer (the
    footer holds every row group's offsets, sizes and statistics, so an edit in place or
    another file under the same name changes it).

    `id_type` is the id's value type (a dictionary-encoded or ``string_view`` id reads as
    ``string``); `partitions` are the Hive values that passthrough columns may name.
    """

    path: Path
    name: str
    num_rows: int
    id_type: pa.DataType
    passthrough: pa.Schema
    size: int
    footer_hash: str
    partitions: tuple[tuple[str, str], ...] = ()

    def identity(self) -> InputIdentity:
        """The identity recorded for the shard (manifest and output metadata)."""
        return InputIdentity(str(self.path), self.size, self.num_rows, self.footer_hash)


def _open_identified(path: Path) -> tuple[pa.NativeFile, int, str]:
    """Open `path` once and return the open file with its size in bytes and the sha256 hex of
    its footer (the last ``8 + length`` bytes: ``<metadata><length: u32 le>PAR1``). The caller
    reads the rows from the same open file, so the identity describes exactly the bytes read
    even when the path is replaced meanwhile. Raises OSError, ValueError or ArrowException."""
    handle = pa.OSFile(str(path), "rb")
    try:
        size = handle.size()
        if size < 12:
            raise ValueError("too short for a Parquet file")
        tail = handle.read_at(8, size - 8)
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1" or length > size - 12:
            raise ValueError("no Parquet footer at the end of the file")
        footer = handle.read_at(length, size - 8 - length)
    except BaseException:
        handle.close()
        raise
    return handle, size, hashlib.sha256(footer + tail).hexdigest()


def plain_type(t: pa.DataType) -> pa.DataType:
    """`t` without dictionary encoding, with ``string_view`` as ``string`` (what pandas,
    Spark and Hugging Face datasets write for the same values)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string_view(t):
        return pa.string()
    return t


def _is_string(t: pa.DataType) -> bool:
    t = plain_type(t)
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_list(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def _messages_problem(t: pa.DataType) -> str | None:
    """Why `t` is not a list of struct<role: string, content: string>, or None if it is."""
    if not _is_list(t):
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


def _check_sampling_fields(
    path: Path, column: str, t: pa.DataType, allowed: Collection[str]
) -> None:
    for idx in range(t.num_fields):
        name = t.field(idx).name
        if name not in allowed:
            close = difflib.get_close_matches(name, list(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise InputError(
                f"{path}: column '{column}' (the sampling_params column) has a field '{name}' "
                f"that is not a sampling parameter{hint}; expected some of: "
                f"{', '.join(sorted(allowed))}"
            )


def inspect_shard(
    path: Path,
    columns: ColumnMap,
    *,
    name: str | None = None,
    partitions: tuple[tuple[str, str], ...] = (),
    sampling_fields: Collection[str] | None = None,
) -> ShardInfo:
    """Check one shard's schema against `columns`, reading only the Parquet footer.

    Expected types: id an integer or string; prompt a string; messages a list of
    struct<role: string, content: string> (other struct fields allowed); prompt_token_ids a
    list of integers; sampling_params a struct, whose fields must all be in `sampling_fields`
    when given; passthrough anything, or the key of a Hive partition (`partitions`, read as a
    string column). Strings may be ``large_string``, ``string_view`` or dictionary-encoded.
    `name` is the output shard name (default: the file name). Raises InputError naming the
    file and the column.
    """
    try:
        handle, size, footer_hash = _open_identified(path)
        with handle, pq.ParquetFile(handle) as parquet_file:
            schema = parquet_file.schema_arrow
            num_rows = parquet_file.metadata.num_rows
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ShardReadError(f"{path}: not a readable Parquet file ({exc})") from exc

    id_field = _check_column(path, schema, "id", columns.id)
    id_type = plain_type(id_field.type)
    if not (pa.types.is_integer(id_type) or _is_string(id_type)):
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
    if columns.prompt_token_ids is not None:
        ids_field = _check_column(path, schema, "prompt_token_ids", columns.prompt_token_ids)
        if not (_is_list(ids_field.type) and pa.types.is_integer(ids_field.type.value_type)):
            raise InputError(
                f"{path}: column '{columns.prompt_token_ids}' (the prompt_token_ids column) has "
                f"type {ids_field.type}; expected a list of integers (list<int32> or list<int64>)"
            )
    if columns.sampling_params is not None:
        sp_field = _check_column(path, schema, "sampling_params", columns.sampling_params)
        if not pa.types.is_struct(sp_field.type):
            raise InputError(
                f"{path}: column '{columns.sampling_params}' (the sampling_params column) has "
                f"type {sp_field.type}; expected a struct of sampling parameters"
            )
        if sampling_fields is not None:
            _check_sampling_fields(path, columns.sampling_params, sp_field.type, sampling_fields)
    partition_values = dict(partitions)
    passthrough_fields: list[pa.Field] = []
    for column in columns.passthrough:
        if schema.get_field_index(column) < 0 and column in partition_values:
            passthrough_fields.append(pa.field(column, pa.string()))
        else:
            passthrough_fields.append(_check_column(path, schema, "passthrough", column))
    return ShardInfo(
        path=path,
        name=path.name if name is None else name,
        num_rows=num_rows,
        id_type=id_type,
        passthrough=pa.schema(passthrough_fields),
        size=size,
        footer_hash=footer_hash,
        partitions=partitions,
    )


def iter_shard_batches(
    path: Path,
    columns: ColumnMap,
    batch_rows: int,
    *,
    partitions: tuple[tuple[str, str], ...] = (),
    expected: InputIdentity | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the shard's rows in file order, `batch_rows` rows per batch (the last may be
    shorter), with only `columns.required_columns`, in that order.

    The file is opened once: its identity (size, row count, footer hash) is taken from the open
    file and, when `expected` is given (the identity recorded at planning), compared before any
    row is read, so the rows always belong to the identity the output is stamped with; a
    mismatch raises `InputChangedError`. The id column comes as its `plain_type`; a
    passthrough column the file lacks but `partitions` has is filled with that partition value
    (string). A plain generator: nothing is opened before the first ``next``; the file closes
    when the generator is exhausted, closed or garbage-collected. A read failure raises
    ShardReadError naming the file and the row where it happened.
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    names = list(columns.required_columns)
    num_rows_read = 0
    try:
        handle, size, footer_hash = _open_identified(path)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ShardReadError(f"{path}: not a readable Parquet file ({exc})") from exc
    with handle:
        try:
            parquet_file = pq.ParquetFile(handle, pre_buffer=False, buffer_size=_STREAM_BUFFER_BYTES)
        except (OSError, pa.ArrowException) as exc:
            raise ShardReadError(f"{path}: not a readable Parquet file ({exc})") from exc
        with parquet_file:
            if expected is not None:
                found = InputIdentity(str(path), size, parquet_file.metadata.num_rows, footer_hash)
                check_unchanged(expected, found)
            in_file = set(parquet_file.schema_arrow.names)
            constants = {k: v for k, v in partitions if k in names and k not in in_file}
            read = [n for n in names if n not in constants]
            batches = parquet_file.iter_batches(batch_size=batch_rows, columns=read, use_threads=False)
            while True:
                try:
                    batch = next(batches, None)
                except (OSError, pa.ArrowException) as exc:
                    raise ShardReadError(
                        f"{path}: reading failed after row {num_rows_read} ({exc})"
                    ) from exc
                if batch is None:
                    return
                num_rows_read += batch.num_rows
                yield _with_plain_id(_with_constants(batch, constants), columns.id).select(names)


def check_unchanged(expected: InputIdentity, found: InputIdentity) -> None:
    """Raise InputChangedError naming the file when `found` (taken from the open file being
    read) is not the identity recorded at planning."""
    if not expected.matches(found):
        raise InputChangedError(
            f"{found.path}: the input shard changed after the job was planned (then: "
            f"{expected.describe()}; now: {found.describe()}); nothing of it was written: run "
            "the job again to plan it anew"
        )


def _with_constants(batch: pa.RecordBatch, constants: dict[str, str]) -> pa.RecordBatch:
    for key, value in constants.items():
        batch = batch.append_column(key, pa.array([value] * batch.num_rows, pa.string()))
    return batch


def _with_plain_id(batch: pa.RecordBatch, id_column: str) -> pa.RecordBatch:
    idx = batch.schema.get_field_index(id_column)
    column = batch.column(idx)
    target = plain_type(column.type)
    if target == column.type:
        return batch
    return batch.set_column(idx, id_column, column.cast(target))
