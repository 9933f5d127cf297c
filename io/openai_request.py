"""One OpenAI Batch API request line parsed into the reader's columns (`OPENAI_COLUMNS`).

A request line is ``{"custom_id", "method": "POST", "url", "body"}`` with url
``/v1/chat/completions`` (body ``messages``) or ``/v1/completions`` (body ``prompt``). Body
fields map onto SamplingParams names (`SUPPORTED_BODY_FIELDS`): ``frequency_penalty``,
``presence_penalty``, ``logit_bias`` (an object of token-id strings to biases) and vLLM's
``min_tokens`` are honoured; ``model`` is kept to be echoed; fields that cannot change the
output at their neutral value are accepted at that value only. A completions request with
``echo: true`` repeats its prompt before the output (the ``echo`` column: "echo"), with the
prompt's token log-probabilities when ``logprobs`` is set; with ``max_tokens: 0`` as well it
generates nothing and returns the prompt's log-probabilities only ("prompt_only": the classic
scoring request).

Invariant: `parse_request` never raises; a problem is the row's `request_error` {code,
message}. Reading files of such lines is `batchgen.io.openai_batch`.

May import: the standard library and pyarrow. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from .openai_response_format import STRUCTURED_OUTPUTS_TYPE, structured_outputs_from_response_format
from .schema import ColumnMap

__all__ = [
    "CHAT_URL",
    "COMPLETIONS_URL",
    "OPENAI_COLUMNS",
    "PASSTHROUGH_SCHEMA",
    "REQUEST_SCHEMA",
    "SUPPORTED_BODY_FIELDS",
    "empty_row",
    "parse_request",
    "short",
]

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"

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
    echo="echo",
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
        pa.field("presence_penalty", pa.float64()),
        pa.field("frequency_penalty", pa.float64()),
        pa.field("min_tokens", pa.int64()),
        pa.field("logit_bias", pa.map_(pa.int64(), pa.float64())),
        pa.field("prompt_logprobs", pa.int64()),
        pa.field("structured_outputs", STRUCTURED_OUTPUTS_TYPE),
    ]
)
_MESSAGE_TYPE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
PASSTHROUGH_SCHEMA = pa.schema(
    [pa.field("url", pa.string()), pa.field("model", pa.string()), pa.field("line", pa.int64())]
)
REQUEST_SCHEMA = pa.schema(
    [
        pa.field("custom_id", pa.string()),
        pa.field("prompt", pa.string()),
        pa.field("messages", pa.list_(_MESSAGE_TYPE)),
        pa.field("sampling_params", _SAMPLING_TYPE),
        pa.field("request_error", pa.struct([pa.field("code", pa.string()), pa.field("message", pa.string())])),
        pa.field("echo", pa.string()),
        *PASSTHROUGH_SCHEMA,
    ]
)

# body field -> the SamplingParams field it sets (chat's logprobs/top_logprobs are special).
_INT_FIELDS = {
    "n": "n",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "seed": "seed",
    "min_tokens": "min_tokens",
}
_FLOAT_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
}
# Fields that change nothing at these values, accepted at them only.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "stream": (False, None),
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
        "seed", "logprobs", "top_logprobs", "frequency_penalty", "presence_penalty", "logit_bias",
        "min_tokens", "response_format",
    ),
    COMPLETIONS_URL: (
        "prompt", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs",
        "frequency_penalty", "presence_penalty", "logit_bias", "min_tokens", "echo", "response_format",
    ),
}
# Fields accepted only at their neutral value on chat requests (OpenAI's chat API has no echo).
_CHAT_NEUTRAL = {"echo": (False, None)}


class _BadRequest(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def short(value: Any) -> str:
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
        return short(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(body: Mapping[str, Any], key: str) -> float:
    value = body[key]
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or (isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX):
        raise _BadRequest("invalid_request", f"body.{key} must be a number, got {short(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise _BadRequest("invalid_request", f"body.{key} must be a finite number, got {short(value)}")
    return number


def _integer(body: Mapping[str, Any], key: str) -> int:
    value = body[key]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise _BadRequest("invalid_request", f"body.{key} must be an integer, got {short(value)}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _BadRequest(
            "invalid_request", f"body.{key} must be a 64-bit integer, got {short(value)}"
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
                    f"{where}: only text content parts are supported, got {short(part)}",
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


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's ``logit_bias``: an object of token ids (as strings) to numbers."""
    if not isinstance(value, Mapping):
        raise _BadRequest("invalid_request", f"body.logit_bias must be an object of token ids to biases, got {short(value)}")
    bias: dict[int, float] = {}
    for key, number in value.items():
        if not isinstance(key, str) or not key.isascii() or not key.isdigit() or len(key) > 18:
            raise _BadRequest("invalid_request", f"body.logit_bias keys must be token ids, got {short(key)}")
        is_number = isinstance(number, int | float) and not isinstance(number, bool)
        if is_number and isinstance(number, int) and not _INT64_MIN <= number <= _INT64_MAX:
            is_number = False  # too large for a float
        if not is_number or not math.isfinite(number):
            raise _BadRequest("invalid_request", f"body.logit_bias[{key}] must be a number, got {short(number)}")
        bias[int(key)] = float(number)
    return bias


def _echo(body: Mapping[str, Any], params: dict[str, Any]) -> str | None:
    """The echo mode of a completions request ("echo", "prompt_only" or None); with echo, the
    prompt's logprobs come with `logprobs`, and max_tokens 0 leaves only the prompt."""
    value = body.get("echo")
    if value is None or value is False:
        return None
    if value is not True:
        raise _BadRequest("invalid_request", f"body.echo must be true or false, got {short(value)}")
    if params.get("logprobs") is not None:
        params["prompt_logprobs"] = params["logprobs"]
    if params.get("max_tokens") == 0:
        for key in ("max_tokens", "logprobs", "min_tokens"):
            params.pop(key, None)
        return "prompt_only"
    return "echo"


def _sampling(body: Mapping[str, Any], url: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    allowed = set(SUPPORTED_BODY_FIELDS[url])
    neutral_fields = {**_NEUTRAL, **(_CHAT_NEUTRAL if url == CHAT_URL else {})}
    for key, value in body.items():
        if key in _IGNORED or key in ("messages", "prompt"):
            continue
        if key in neutral_fields:
            if not any(_is_neutral(value, neutral) for neutral in neutral_fields[key]):
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
        elif key == "logit_bias":
            params["logit_bias"] = _logit_bias(value)
        elif key == "echo":
            continue  # read by _echo, once the other fields are known
        elif key == "logprobs" and url == COMPLETIONS_URL:
            params["logprobs"] = _integer(body, key)
        elif key == "logprobs":
            if not isinstance(value, bool):
                raise _BadRequest("invalid_request", f"body.logprobs must be true or false, got {short(value)}")
            if value:
                params.setdefault("logprobs", 0)
        elif key == "top_logprobs":
            if body.get("logprobs") is not True:
                raise _BadRequest("invalid_request", "body.top_logprobs needs body.logprobs: true")
            params["logprobs"] = _integer(body, key)
    return params


def empty_row(line: int) -> dict[str, Any]:
    return {
        "custom_id": None,
        "prompt": None,
        "messages": None,
        "sampling_params": None,
        "request_error": None,
        "echo": None,
        "url": None,
        "model": None,
        "line": line,
    }


def parse_request(raw: bytes, line: int) -> dict[str, Any]:
    """One request line as a row of the reader's schema (see `OPENAI_COLUMNS`); a problem
    sets `request_error` and never raises. `line` is the 1-based line number."""
    row = empty_row(line)
    try:
        try:
            request = json.loads(raw, parse_constant=_reject_constant)
        except UnicodeDecodeError as exc:
            raise _BadRequest("invalid_utf8", f"line {line} is not valid UTF-8 ({exc.reason})") from None
        except RecursionError:
            raise _BadRequest("invalid_json", f"line {line} nests JSON too deeply") from None
        except ValueError as exc:
            raise _BadRequest("invalid_json", f"line {line} is not valid JSON ({short(str(exc))})") from None
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
            raise _BadRequest("invalid_request", f"method must be POST, got {short(request.get('method'))}")
        if url not in (CHAT_URL, COMPLETIONS_URL):
            raise _BadRequest(
                "unsupported_url",
                f"url {short(url)} is not supported; expected {CHAT_URL} or {COMPLETIONS_URL}",
            )
        if not isinstance(body, Mapping):
            raise _BadRequest("invalid_request", "body must be a JSON object")
        if url == CHAT_URL:
            row["messages"] = _messages(body)
        else:
            row["prompt"] = _prompt(body)
        params = _sampling(body, url)
        if url == COMPLETIONS_URL:
            row["echo"] = _echo(body, params)
        row["sampling_params"] = params or None
    except _BadRequest as exc:
        row["request_error"] = {"code": exc.code, "message": exc.message}
        row["prompt"] = row["messages"] = row["sampling_params"] = row["echo"] = None
    return row
