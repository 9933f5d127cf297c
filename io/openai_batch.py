"""OpenAI Batch API files: request lines in, as Arrow record batches; response lines out.

Owns: the streamed reading of a request file (`count_requests`, `inspect_openai_batch`,
`iter_openai_batches`) into the columns of `OPENAI_COLUMNS`. One request line is parsed by
`batchgen.io.openai_request` (`parse_request`: the body fields supported, echo and scoring
requests), whose names are re-exported here. Response files are written by
`batchgen.io.jsonl_writer`.

Invariants:
- One row per non-blank line, in file order, whatever the line holds: a line that is not
  JSON (NaN and Infinity included), nests too deep, holds a number or string Arrow cannot store
  (an integer beyond 64 bits, a lone surrogate), is longer than `max_line_bytes`, is not a
  request, names another url, lacks a custom_id or uses an unsupported field still yields a
  row, with `request_error` {code, message} set; the job writes it as an error line. Parsing a
  line never raises.
- Memory stays near one batch of lines plus `max_line_bytes`: the file is read in 1 MiB chunks
  (`iter_request_lines`), and a line over the limit is skipped without being held.
- A request file's identity (size, request count, sha256 of the whole file) is computed in the
  same streamed pass that reads it, and checked against the planned identity before the last
  batch is handed out, so no response file is committed from a file edited while it was read.

May import: the standard library and pyarrow. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from .errors import InputError
from .identity import InputIdentity
from .openai_request import (
    CHAT_URL,
    COMPLETIONS_URL,
    OPENAI_COLUMNS,
    PASSTHROUGH_SCHEMA,
    REQUEST_SCHEMA,
    SUPPORTED_BODY_FIELDS,
    empty_row,
    parse_request,
    short,
)
from .reader import ShardInfo, check_unchanged

__all__ = [
    "CHAT_URL",
    "COMPLETIONS_URL",
    "DEFAULT_MAX_LINE_BYTES",
    "OPENAI_COLUMNS",
    "SUPPORTED_BODY_FIELDS",
    "count_requests",
    "inspect_openai_batch",
    "iter_openai_batches",
    "iter_request_lines",
    "non_blank_lines",
    "parse_request",
    "request_file_identity",
]

# The longest request line read (bytes, newline excluded); a longer one is an error line. Chat
# requests of a long context are tens of KiB; 16 MiB leaves room for very long documents.
DEFAULT_MAX_LINE_BYTES = 16 << 20
_CHUNK_BYTES = 1 << 20


def _too_long_row(line: int, num_bytes: int, max_line_bytes: int) -> dict[str, Any]:
    row = empty_row(line)
    row["request_error"] = {
        "code": "line_too_long",
        "message": f"line {line} has {num_bytes} bytes, more than input.max_line_bytes = {max_line_bytes}",
    }
    return row


@dataclass(frozen=True, slots=True)
class RequestLine:
    """A non-blank line of a request file: its bytes (newline excluded), or None when it is
    longer than the limit it was read under; `num_bytes` is its length either way."""

    data: bytes | None
    num_bytes: int


def iter_request_lines(
    handle: IO[bytes], max_line_bytes: int, digest: Any = None
) -> Iterator[RequestLine]:
    """The non-blank lines of a binary file (blank: only ASCII whitespace), read in 1 MiB
    chunks so that memory stays near `max_line_bytes` whatever the file holds (one line of
    gigabytes, or no newline at all). Every byte read also goes to `digest.update` when a
    digest (hashlib) is given."""
    pending = bytearray()
    num_bytes = 0
    has_text = False
    while True:
        chunk = handle.read(_CHUNK_BYTES)
        if digest is not None:
            digest.update(chunk)
        if not chunk:
            break
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            piece = chunk[start:end]
            num_bytes += len(piece)
            has_text = has_text or bool(piece.strip())
            if num_bytes <= max_line_bytes:
                pending += piece
            elif pending:
                pending = bytearray()  # over the limit: drop what was held
            if newline < 0:
                break
            if has_text:
                yield RequestLine(bytes(pending) if num_bytes <= max_line_bytes else None, num_bytes)
            pending, num_bytes, has_text = bytearray(), 0, False
            start = newline + 1
    if has_text:
        yield RequestLine(bytes(pending) if num_bytes <= max_line_bytes else None, num_bytes)


def non_blank_lines(handle: IO[bytes]) -> Iterator[bytes]:
    """The lines of a binary file that hold more than whitespace (for files batchgen wrote)."""
    for raw in handle:
        if raw.strip():
            yield raw


def count_requests(path: Path) -> int:
    """The number of non-blank lines of a request file (one pass, bounded memory). Raises
    InputError naming the file when it cannot be read."""
    return request_file_identity(path)[1]


def request_file_identity(path: Path) -> tuple[int, int, str]:
    """(size in bytes, number of requests, sha256 hex of the whole file) of a request file, in
    one streamed pass (bounded memory: `iter_request_lines`). The whole file is hashed, not a
    head and tail: a request file is read in full anyway to count its lines, and any edit then
    changes the hash. Raises InputError naming the file when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            # The limit only bounds memory here: a line over it still counts as a request.
            count = sum(1 for _ in iter_request_lines(handle, 0, digest))
            size = handle.tell()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the request file ({exc.strerror or exc})") from exc
    return size, count, digest.hexdigest()


def inspect_openai_batch(path: Path, *, name: str | None = None) -> ShardInfo:
    """The shard of one request file: its requests, a string id (custom_id) and the
    passthrough columns url, model and line, and its identity (`request_file_identity`: size,
    request count as rows, sha256 of the whole file as the footer hash). Raises InputError
    when it cannot be read."""
    if not path.is_file():
        raise InputError(f"{path}: the request file does not exist")
    size, num_rows, file_hash = request_file_identity(path)
    return ShardInfo(
        path=path,
        name=path.name if name is None else name,
        num_rows=num_rows,
        id_type=pa.string(),
        passthrough=PASSTHROUGH_SCHEMA,
        size=size,
        footer_hash=file_hash,
    )


def rows_to_request_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Rows of `parse_request` as one record batch with `OPENAI_COLUMNS.required_columns`.
    `parse_request` checks every value Arrow stores; should a row still fail to convert, it
    becomes an error row on its own (the other rows are kept), so this never raises on data."""
    names = list(OPENAI_COLUMNS.required_columns)
    try:
        return pa.RecordBatch.from_pylist(rows, schema=REQUEST_SCHEMA).select(names)
    except (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeError):
        pass
    checked = []
    for row in rows:
        try:
            pa.RecordBatch.from_pylist([row], schema=REQUEST_SCHEMA)
        except (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeError) as exc:
            row = empty_row(row["line"])
            row["request_error"] = {
                "code": "invalid_request",
                "message": f"line {row['line']} holds a value that cannot be stored ({short(str(exc))})",
            }
        checked.append(row)
    return pa.RecordBatch.from_pylist(checked, schema=REQUEST_SCHEMA).select(names)


def iter_openai_batches(
    path: Path,
    batch_rows: int,
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    expected: InputIdentity | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the requests of a file in line order as record batches of `batch_rows` rows with
    `OPENAI_COLUMNS.required_columns`; a line longer than `max_line_bytes` is an error row
    (``line_too_long``). With `expected` (the identity recorded at planning), the file is
    hashed as it is read and the last batch is yielded only once the file proved unchanged;
    otherwise `InputChangedError` is raised. A plain generator; the file closes with it."""
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    if max_line_bytes < 1:
        raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the request file ({exc.strerror or exc})") from exc
    digest = hashlib.sha256() if expected is not None else None
    with handle:
        rows: list[dict[str, Any]] = []
        ready: pa.RecordBatch | None = None  # held back until the next batch (or the check)
        number = 0
        for number, line in enumerate(iter_request_lines(handle, max_line_bytes, digest), start=1):
            if line.data is None:
                rows.append(_too_long_row(number, line.num_bytes, max_line_bytes))
            else:
                rows.append(parse_request(line.data, number))
            if len(rows) == batch_rows:
                if ready is not None:
                    yield ready
                ready, rows = rows_to_request_batch(rows), []
        if rows:
            if ready is not None:
                yield ready
            ready = rows_to_request_batch(rows)
        if expected is not None and digest is not None:
            found = InputIdentity(str(path), handle.tell(), number, digest.hexdigest())
            check_unchanged(expected, found)
        if ready is not None:
            yield ready
