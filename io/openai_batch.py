"""OpenAI Batch API files: request lines in, as Arrow record batches; response lines out.

Owns: parsing one request line (`parse_request`) into the columns of `OPENAI_COLUMNS` and the
streamed reading of a request file (`count_requests`, `inspect_openai_batch`,
`iter_openai_batches`). Response files are written by `batchgen.io.jsonl_writer`.

A request line is ``{"custom_id", "method": "POST", "url", "body"}`` with url
``/v1/chat/completions`` (body ``messages``) or ``/v1/completions`` (body ``prompt``). Body
fields map onto SamplingParams names (`SUPPORTED_BODY_FIELDS`); ``model`` is kept to be echoed;
fields that cannot change the output at their neutral value are accepted at that value only.

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
import json
import math
import reprlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from .errors import InputError
from .identity import InputIdentity
from .openai_response_format import STRUCTURED_OUTPUTS_TYPE, structured_outputs_from_response_format
from .reader import ShardInfo, check_unchanged
from .schema import ColumnMap

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

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"

# The longest request line read (bytes, newline excluded); a longer one is an error line. Chat
# requests of a long context are tens of KiB; 16 MiB leaves room for very long documents.
DEFAULT_MAX_LINE_BYTES = 16 << 20
_CHUNK_BYTES = 1 << 20
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Error messages quote values through this: a few hundred characters, nested values cut short.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlist = _SHORT.maxdict = 6
_SHORT.maxlevel = 3

OPENAI_COLUMNS = ColumnMap(
    id="custom_id",
    prompt="prompt",
    messages="messages",
    sampling_params="sampling_params",
    passthrough=("url", "model", "line"),
    row_error="request_error",
)

_SAMPLING_TYPE = pa.struct(
    [
        pa.field("n", pa.int64()),
        pa.field("max_tokens", pa.int64()),
        pa.field("temperature", pa.float64()),
        pa.field("top_p", pa.float64()),
        pa.field("seed", pa.int64()),
        pa.field("stop", pa.list_(pa.string())),
        pa.field("logprobs", pa.int64()),
        pa.field("structured_outputs", STRUCTURED_OUTPUTS_TYPE),
    ]
)
_MESSAGE_TYPE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
_PASSTHROUGH = pa.schema(
    [pa.field("url", pa.string()), pa.field("model", pa.string()), pa.field("line", pa.int64())]
)
_SCHEMA = pa.schema(
    [
        pa.field("custom_id", pa.string()),
        pa.field("prompt", pa.string()),
        pa.field("messages", pa.list_(_MESSAGE_TYPE)),
        pa.field("sampling_params", _SAMPLING_TYPE),
        pa.field("request_error", pa.struct([pa.field("code", pa.string()), pa.field("message", pa.string())])),
        *_PASSTHROUGH,
    ]
)

# body field -> the SamplingParams field it sets (chat's logprobs/top_logprobs are special).
_INT_FIELDS = {"n": "n", "max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "seed": "seed"}
_FLOAT_FIELDS = {"temperature": "temperature", "top_p": "top_p"}
# Fields that change nothing at these values, accepted at them only.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "stream": (False, None),
    "frequency_penalty": (0, None),
    "presence_penalty": (0, None),
    "logit_bias": ({}, None),
    "echo": (False, None),
    "best_of": (1, None),
    "suffix": (None, ""),
    "tools": ([], None),
    "tool_choice": ("none", None),
    "parallel_tool_calls": (None, True, False),
    "stream_options": (None,),
}
# Fields that never change the output.
_IGNORED = frozenset({"model", "user", "metadata", "store", "service_tier"})

SUPPORTED_BODY_FIELDS = {
    CHAT_URL: (
        "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
        "seed", "logprobs", "top_logprobs", "response_format",
    ),
    COMPLETIONS_URL: (
        "prompt", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs", "response_format",
    ),
}


class _BadRequest(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    """`value` for an error message: at most a few hundred characters, however big it is."""
    return _SHORT.repr(value)


def _name(key: str) -> str:
    """A field name for an error message, cut to 80 characters, lone surrogates escaped."""
    text = key if len(key) <= 80 else key[:77] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _short_json(value: Any) -> str:
    """`value` as JSON for an error message, cut to about 80 characters."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (RecursionError, TypeError, ValueError):
        return _short(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(body: Mapping[str, Any], key: str) -> float:
    value = body[key]
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or (isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX):
        raise _BadRequest("invalid_request", f"body.{key} must be a number, got {_short(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise _BadRequest("invalid_request", f"body.{key} must be a finite number, got {_short(value)}")
    return number


def _integer(body: Mapping[str, Any], key: str) -> int:
    value = body[key]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise _BadRequest("invalid_request", f"body.{key} must be an integer, got {_short(value)}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _BadRequest(
            "invalid_request", f"body.{key} must be a 64-bit integer, got {_short(value)}"
        )
    return int(value)


def _string(value: str, where: str) -> str:
    """`value` if it can be written as UTF-8 (JSON can hold lone surrogates, Arrow cannot)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _BadRequest(
            "invalid_utf8", f"{where} holds a character that is not valid Unicode ({exc.reason})"
        ) from None
    return value


def _plain_string(value: Any) -> str | None:
    """`value` when it is a string UTF-8 can hold, else None (for fields only echoed back)."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def _is_neutral(value: Any, neutral: Any) -> bool:
    """`value` is `neutral`, comparing like with like (`true` is not 1, 0.0 is 0)."""
    if neutral is None or isinstance(neutral, bool):
        return value is neutral
    if isinstance(neutral, int):
        return isinstance(value, int | float) and not isinstance(value, bool) and value == neutral
    return type(value) is type(neutral) and bool(value == neutral)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _text(content: Any, where: str) -> str:
    """A message's content: a string or a list of text parts."""
    if isinstance(content, str):
        return _string(content, where)
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _BadRequest(
                    "unsupported_field",
                    f"{where}: only text content parts are supported, got {_short(part)}",
                )
            parts.append(_string(part["text"], where))
        return "".join(parts)
    raise _BadRequest("invalid_request", f"{where} must be a string or a list of text parts")


def _messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise _BadRequest("invalid_request", "body.messages must be a non-empty list of {role, content}")
    messages = []
    for idx, message in enumerate(value):
        where = f"body.messages[{idx}]"
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise _BadRequest("invalid_request", f"{where} must be an object with a string role")
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise _BadRequest("unsupported_field", f"{where}.{_name(extra[0])} is not supported")
        role = _string(message["role"], f"{where}.role")
        messages.append({"role": role, "content": _text(message.get("content"), f"{where}.content")})
    return messages


def _prompt(body: Mapping[str, Any]) -> str:
    value = body.get("prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, list):
        raise _BadRequest(
            "unsupported_field", "body.prompt: only one text prompt per request is supported"
        )
    if not isinstance(value, str):
        raise _BadRequest("invalid_request", "body.prompt must be a string")
    return _string(value, "body.prompt")


def _sampling(body: Mapping[str, Any], url: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    allowed = set(SUPPORTED_BODY_FIELDS[url])
    for key, value in body.items():
        if key in _IGNORED or key in ("messages", "prompt"):
            continue
        if key in _NEUTRAL:
            if not any(_is_neutral(value, neutral) for neutral in _NEUTRAL[key]):
                raise _BadRequest(
                    "unsupported_field",
                    f"body.{key}={_short_json(value)} is not supported (it would change the output)",
                )
            continue
        if key not in allowed:
            raise _BadRequest("unsupported_field", f"body.{_name(key)} is not supported for {url}")
        if value is None:
            continue
        if key in _INT_FIELDS:
            name = _INT_FIELDS[key]
            number = _integer(body, key)
            if name in params and params[name] != number:
                raise _BadRequest("invalid_request", "body.max_tokens and body.max_completion_tokens differ")
            params[name] = number
        elif key in _FLOAT_FIELDS:
            params[_FLOAT_FIELDS[key]] = _number(body, key)
        elif key == "response_format":
            try:
                structured = structured_outputs_from_response_format(value)
            except ValueError as exc:
                raise _BadRequest("invalid_request", str(exc)) from None
            if structured is not None:
                params["structured_outputs"] = structured
        elif key == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise _BadRequest("invalid_request", "body.stop must be a string or a list of strings")
            params["stop"] = [_string(s, "body.stop") for s in stops]
        elif key == "logprobs" and url == COMPLETIONS_URL:
            params["logprobs"] = _integer(body, key)
        elif key == "logprobs":
            if not isinstance(value, bool):
                raise _BadRequest("invalid_request", f"body.logprobs must be true or false, got {_short(value)}")
            if value:
                params.setdefault("logprobs", 0)
        elif key == "top_logprobs":
            if body.get("logprobs") is not True:
                raise _BadRequest("invalid_request", "body.top_logprobs needs body.logprobs: true")
            params["logprobs"] = _integer(body, key)
    return params


def _empty_row(line: int) -> dict[str, Any]:
    return {
        "custom_id": None,
        "prompt": None,
        "messages": None,
        "sampling_params": None,
        "request_error": None,
        "url": None,
        "model": None,
        "line": line,
    }


def parse_request(raw: bytes, line: int) -> dict[str, Any]:
    """One request line as a row of the reader's schema (see `OPENAI_COLUMNS`); a problem
    sets `request_error` and never raises. `line` is the 1-based line number."""
    row = _empty_row(line)
    try:
        try:
            request = json.loads(raw, parse_constant=_reject_constant)
        except UnicodeDecodeError as exc:
            raise _BadRequest("invalid_utf8", f"line {line} is not valid UTF-8 ({exc.reason})") from None
        except RecursionError:
            raise _BadRequest("invalid_json", f"line {line} nests JSON too deeply") from None
        except ValueError as exc:
            raise _BadRequest("invalid_json", f"line {line} is not valid JSON ({_short(str(exc))})") from None
        if not isinstance(request, Mapping):
            raise _BadRequest("invalid_request", f"line {line} is not a JSON object")
        custom_id = _plain_string(request.get("custom_id"))
        row["custom_id"] = custom_id or None
        url = request.get("url")
        row["url"] = _plain_string(url)
        body = request.get("body")
        if isinstance(body, Mapping):
            row["model"] = _plain_string(body.get("model"))
        if row["custom_id"] is None:
            raise _BadRequest(
                "missing_custom_id", f"line {line} has no custom_id (a non-empty, valid Unicode string)"
            )
        if request.get("method", "POST") != "POST":
            raise _BadRequest("invalid_request", f"method must be POST, got {_short(request.get('method'))}")
        if url not in (CHAT_URL, COMPLETIONS_URL):
            raise _BadRequest(
                "unsupported_url",
                f"url {_short(url)} is not supported; expected {CHAT_URL} or {COMPLETIONS_URL}",
            )
        if not isinstance(body, Mapping):
            raise _BadRequest("invalid_request", "body must be a JSON object")
        if url == CHAT_URL:
            row["messages"] = _messages(body)
        else:
            row["prompt"] = _prompt(body)
        row["sampling_params"] = _sampling(body, url) or None
    except _BadRequest as exc:
        row["request_error"] = {"code": exc.code, "message": exc.message}
        row["prompt"] = row["messages"] = row["sampling_params"] = None
    return row


def _too_long_row(line: int, num_bytes: int, max_line_bytes: int) -> dict[str, Any]:
    row = _empty_row(line)
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
        passthrough=_PASSTHROUGH,
        size=size,
        footer_hash=file_hash,
    )


def rows_to_request_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Rows of `parse_request` as one record batch with `OPENAI_COLUMNS.required_columns`.
    `parse_request` checks every value Arrow stores; should a row still fail to convert, it
    becomes an error row on its own (the other rows are kept), so this never raises on data."""
    names = list(OPENAI_COLUMNS.required_columns)
    try:
        return pa.RecordBatch.from_pylist(rows, schema=_SCHEMA).select(names)
    except (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeError):
        pass
    checked = []
    for row in rows:
        try:
            pa.RecordBatch.from_pylist([row], schema=_SCHEMA)
        except (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeError) as exc:
            row = _empty_row(row["line"])
            row["request_error"] = {
                "code": "invalid_request",
                "message": f"line {row['line']} holds a value that cannot be stored ({_short(str(exc))})",
            }
        checked.append(row)
    return pa.RecordBatch.from_pylist(checked, schema=_SCHEMA).select(names)


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
