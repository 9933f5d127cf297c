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
  JSON, not a request, names another url, lacks a custom_id or uses an unsupported field still
  yields a row, with `request_error` {code, message} set; the job writes it as an error line.
- Memory stays near one batch of lines: the file is read line by line.

May import: the standard library and pyarrow. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from .errors import InputError
from .reader import ShardInfo
from .schema import ColumnMap

__all__ = [
    "CHAT_URL",
    "COMPLETIONS_URL",
    "OPENAI_COLUMNS",
    "SUPPORTED_BODY_FIELDS",
    "count_requests",
    "inspect_openai_batch",
    "iter_openai_batches",
    "non_blank_lines",
    "parse_request",
    "request_file_identity",
]

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"

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
    "response_format": ({"type": "text"}, None),
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
        "seed", "logprobs", "top_logprobs",
    ),
    COMPLETIONS_URL: ("prompt", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs"),
}


class _BadRequest(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: Mapping[str, Any], key: str) -> float:
    value = body[key]
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise _BadRequest("invalid_request", f"body.{key} must be a number, got {value!r}")
    return float(value)


def _integer(body: Mapping[str, Any], key: str) -> int:
    value = body[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise _BadRequest("invalid_request", f"body.{key} must be an integer, got {value!r}")
    return int(value)


def _text(content: Any, where: str) -> str:
    """A message's content: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _BadRequest(
                    "unsupported_field", f"{where}: only text content parts are supported, got {part!r}"
                )
            parts.append(part["text"])
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
            raise _BadRequest("unsupported_field", f"{where}.{extra[0]} is not supported")
        messages.append({"role": message["role"], "content": _text(message.get("content"), f"{where}.content")})
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
    return value


def _sampling(body: Mapping[str, Any], url: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    allowed = set(SUPPORTED_BODY_FIELDS[url])
    for key, value in body.items():
        if key in _IGNORED or key in ("messages", "prompt"):
            continue
        if key in _NEUTRAL:
            if value not in _NEUTRAL[key]:
                raise _BadRequest(
                    "unsupported_field", f"body.{key}={json.dumps(value)} is not supported (it would change the output)"
                )
            continue
        if key not in allowed:
            raise _BadRequest("unsupported_field", f"body.{key} is not supported for {url}")
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
        elif key == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise _BadRequest("invalid_request", "body.stop must be a string or a list of strings")
            params["stop"] = stops
        elif key == "logprobs" and url == COMPLETIONS_URL:
            params["logprobs"] = _integer(body, key)
        elif key == "logprobs":
            if not isinstance(value, bool):
                raise _BadRequest("invalid_request", "body.logprobs must be true or false")
            if value:
                params.setdefault("logprobs", 0)
        elif key == "top_logprobs":
            if body.get("logprobs") is not True:
                raise _BadRequest("invalid_request", "body.top_logprobs needs body.logprobs: true")
            params["logprobs"] = _integer(body, key)
    return params


def parse_request(raw: bytes, line: int) -> dict[str, Any]:
    """One request line as a row of the reader's schema (see `OPENAI_COLUMNS`); a problem
    sets `request_error` and never raises. `line` is the 1-based line number."""
    row: dict[str, Any] = {
        "custom_id": None,
        "prompt": None,
        "messages": None,
        "sampling_params": None,
        "request_error": None,
        "url": None,
        "model": None,
        "line": line,
    }
    try:
        try:
            request = json.loads(raw)
        except UnicodeDecodeError as exc:
            raise _BadRequest("invalid_utf8", f"line {line} is not valid UTF-8 ({exc.reason})") from None
        except ValueError as exc:
            raise _BadRequest("invalid_json", f"line {line} is not valid JSON ({exc})") from None
        if not isinstance(request, Mapping):
            raise _BadRequest("invalid_request", f"line {line} is not a JSON object")
        custom_id = request.get("custom_id")
        if isinstance(custom_id, str) and custom_id:
            row["custom_id"] = custom_id
        url = request.get("url")
        row["url"] = url if isinstance(url, str) else None
        body = request.get("body")
        if isinstance(body, Mapping) and isinstance(body.get("model"), str):
            row["model"] = body["model"]
        if row["custom_id"] is None:
            raise _BadRequest("missing_custom_id", f"line {line} has no custom_id (a non-empty string)")
        if request.get("method", "POST") != "POST":
            raise _BadRequest("invalid_request", f"method must be POST, got {request.get('method')!r}")
        if url not in (CHAT_URL, COMPLETIONS_URL):
            raise _BadRequest(
                "unsupported_url", f"url {url!r} is not supported; expected {CHAT_URL} or {COMPLETIONS_URL}"
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


def non_blank_lines(handle: IO[bytes]) -> Iterator[bytes]:
    """The lines of a binary file that hold more than whitespace."""
    for raw in handle:
        if raw.strip():
            yield raw


def count_requests(path: Path) -> int:
    """The number of non-blank lines of a request file (one pass, bounded memory). Raises
    InputError naming the file when it cannot be read."""
    return request_file_identity(path)[1]


def request_file_identity(path: Path) -> tuple[int, int, str]:
    """(size in bytes, number of requests, sha256 hex of the whole file) of a request file, in
    one streamed pass (bounded memory). The whole file is hashed, not a head and tail: a request
    file is read in full anyway to count its lines, and any edit then changes the hash. Raises
    InputError naming the file when it cannot be read."""
    digest = hashlib.sha256()
    size = count = 0
    try:
        with path.open("rb") as handle:
            for raw in handle:
                digest.update(raw)
                size += len(raw)
                if raw.strip():
                    count += 1
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


def iter_openai_batches(path: Path, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Yield the requests of a file in line order as record batches of `batch_rows` rows with
    `OPENAI_COLUMNS.required_columns`. A plain generator; the file closes with it."""
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    names = list(OPENAI_COLUMNS.required_columns)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the request file ({exc.strerror or exc})") from exc
    with handle:
        rows: list[dict[str, Any]] = []
        for number, raw in enumerate(non_blank_lines(handle), start=1):
            rows.append(parse_request(raw, number))
            if len(rows) == batch_rows:
                yield pa.RecordBatch.from_pylist(rows, schema=_SCHEMA).select(names)
                rows = []
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=_SCHEMA).select(names)
