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

import fnmatch
import glob
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import InputError, ShardReadError
from .identity import InputIdentity
from .schema import ColumnMap

__all__ = [
    "InputError",
    "ShardInfo",
    "ShardReadError",
    "check_output_outside_inputs",
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


def _input_root(spec: str, base_dir: Path) -> Path:
    """What an input spec reads from: the folder or file itself, or the part of a glob before
    its first wildcard component."""
    resolved = resolve_path(spec, base_dir)
    if _GLOB_CHARS.isdisjoint(spec):
        return resolved
    static: list[str] = []
    for part in Path(spec).expanduser().parts:
        if not _GLOB_CHARS.isdisjoint(part):
            break
        static.append(part)
    return resolve_path(os.path.join(*static), base_dir) if static else base_dir


def _glob_reads_folder(spec: str, base_dir: Path, folder: Path) -> bool:
    """Whether the glob `spec` would match Parquet files placed directly in `folder`: below its
    fixed prefix for a recursive (``**``) glob, else when `folder` matches the glob's folder
    part component by component."""
    pattern = resolve_path(spec, base_dir)
    if "**" in spec:
        root = _input_root(spec, base_dir)
        return folder == root or root in folder.parents
    folder_parts = pattern.parent.parts
    return len(folder.parts) == len(folder_parts) and all(
        fnmatch.fnmatchcase(name, part) for name, part in zip(folder.parts, folder_parts, strict=True)
    )


def check_output_outside_inputs(
    out_dir: Path, spec: str, base_dir: Path, input_paths: list[Path]
) -> None:
    """Refuse an output folder that equals, contains or lies inside the input set: an input
    folder (or file), a folder a glob would read from, or a folder holding an input shard.
    Output shards are named after input shards and ``--restart`` deletes them, so such a folder
    could overwrite or delete the inputs, or feed outputs back as inputs. Symbolic links are
    resolved; no file is touched. Raises InputError naming both paths."""
    out_real = Path(os.path.realpath(out_dir))
    is_glob = not _GLOB_CHARS.isdisjoint(spec)
    root = Path(os.path.realpath(_input_root(spec, base_dir)))
    candidates = [(Path(os.path.realpath(p)), f"the input shard {p}") for p in input_paths]
    if not is_glob:
        candidates.insert(0, (root, f"the input {root}"))
    for path, what in candidates:
        if out_real == path or out_real in path.parents:
            relation = "is" if out_real == path else "contains"
        elif not is_glob and root in out_real.parents:
            relation = "lies inside"
        else:
            continue
        _refuse(out_dir, spec, relation, what)
    if is_glob and (
        _glob_reads_folder(spec, base_dir, Path(os.path.normpath(out_dir)))
        or _glob_reads_folder(spec, base_dir, out_real)
    ):
        _refuse(out_dir, spec, "lies inside", "the folders the input glob reads")


def _refuse(out_dir: Path, spec: str, relation: str, what: str) -> None:
    raise InputError(
        f"output.path {out_dir} {relation} {what} (input.path '{spec}'); output shards "
        "are named after input shards and --restart deletes them, so the output folder "
        "must lie outside the input set: choose another output.path"
    )


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What the footer of one input shard says: rows, the id type and the passthrough fields,
    plus the file's identity: its size in bytes and the sha256 of its Parquet footer (the
    footer holds every row group's offsets, sizes and statistics, so an edit in place or
    another file under the same name changes it)."""

    path: Path
    name: str
    num_rows: int
    id_type: pa.DataType
    passthrough: pa.Schema
    size: int
    footer_hash: str

    def identity(self) -> InputIdentity:
        """The identity recorded for the shard (manifest and output metadata)."""
        return InputIdentity(str(self.path), self.size, self.num_rows, self.footer_hash)


def _footer_identity(path: Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex of the footer) of a Parquet file: the footer is the last
    ``8 + length`` bytes (``<metadata><length: u32 le>PAR1``). Raises OSError or ValueError."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size < 12:
            raise ValueError("too short for a Parquet file")
        handle.seek(size - 8)
        tail = handle.read(8)
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1" or length > size - 12:
            raise ValueError("no Parquet footer at the end of the file")
        handle.seek(size - 8 - length)
        footer = handle.read(length)
    return size, hashlib.sha256(footer + tail).hexdigest()


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
        size, footer_hash = _footer_identity(path)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ShardReadError(f"{path}: not a readable Parquet file ({exc})") from exc

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
        path=path,
        name=path.name,
        num_rows=num_rows,
        id_type=id_field.type,
        passthrough=passthrough,
        size=size,
        footer_hash=footer_hash,
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
        raise ShardReadError(f"{path}: not a readable Parquet file ({exc})") from exc
    with parquet_file:
        batches = parquet_file.iter_batches(batch_size=batch_rows, columns=names, use_threads=False)
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
            yield batch.select(names)
