"""Hostile request lines: every line yields exactly one row -- a valid request or an error row --
and neither parsing nor the Arrow conversion ever raises (issue 20, defect 1); lines longer than
the limit are error rows read in bounded memory (defect 9); a request file edited while it is
read is refused before its last batch (defect 6)."""

from __future__ import annotations

import hashlib
import io
import json
import math
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchgen.io import InputChangedError, InputIdentity
from batchgen.io.openai_batch import (
    CHAT_URL,
    COMPLETIONS_URL,
    OPENAI_COLUMNS,
    inspect_openai_batch,
    iter_openai_batches,
    iter_request_lines,
    parse_request,
    request_file_identity,
    rows_to_request_batch,
)


def _chat(**body: Any) -> dict[str, Any]:
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return {"custom_id": "r1", "method": "POST", "url": CHAT_URL, "body": body}


def _code(row: dict[str, Any]) -> str | None:
    error = row["request_error"]
    return None if error is None else str(error["code"])


def _one_row_batch(raw: bytes) -> pa.RecordBatch:
    """What the reader does with one line: parse it, convert it to Arrow."""
    return rows_to_request_batch([parse_request(raw, 1)])


# --- the reported lines ------------------------------------------------------------------------

REPORTED = {
    # numbers Arrow's int64 columns cannot hold (OverflowError before the fix)
    "max_tokens 1e300": (b'{"custom_id":"a","url":"/v1/completions","body":{"prompt":"x","max_tokens":1e300}}', "invalid_request"),
    "n above 2**63": (json.dumps(_chat(n=2**64)).encode(), "invalid_request"),
    "seed above 2**63": (json.dumps(_chat(seed=2**63)).encode(), "invalid_request"),
    "logprobs above 2**63": (
        json.dumps({"custom_id": "a", "url": COMPLETIONS_URL, "body": {"prompt": "x", "logprobs": 2**70}}).encode(),
        "invalid_request",
    ),
    "top_logprobs above 2**63": (json.dumps(_chat(logprobs=True, top_logprobs=2**70)).encode(), "invalid_request"),
    # a lone surrogate: valid JSON, not encodable as UTF-8 (UnicodeEncodeError before the fix)
    "lone surrogate in the prompt": (
        b'{"custom_id":"a","url":"/v1/completions","body":{"prompt":"hi \\ud83d"}}',
        "invalid_utf8",
    ),
    "lone surrogate in a message": (
        b'{"custom_id":"a","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"\\udfff"}]}}',
        "invalid_utf8",
    ),
    "lone surrogate in a stop string": (json.dumps(_chat(stop=["\ud800"])).encode(), "invalid_utf8"),
    "lone surrogate in the custom_id": (
        b'{"custom_id":"\\ud83d","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"x"}]}}',
        "missing_custom_id",
    ),
    # 100k nested brackets (RecursionError before the fix)
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "invalid_json"),
    "deep nesting inside the body": (
        b'{"custom_id":"a","url":"/v1/completions","body":{"prompt":' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
        "invalid_json",
    ),
    # non-finite numbers: NaN and Infinity are not JSON; 1e400 overflows to inf
    "NaN temperature": (b'{"custom_id":"a","url":"/v1/completions","body":{"prompt":"x","temperature":NaN}}', "invalid_json"),
    "Infinity top_p": (b'{"custom_id":"a","url":"/v1/completions","body":{"prompt":"x","top_p":-Infinity}}', "invalid_json"),
    "1e400 temperature": (b'{"custom_id":"a","url":"/v1/completions","body":{"prompt":"x","temperature":1e400}}', "invalid_request"),
    "1e400 max_tokens": (b'{"custom_id":"a","url":"/v1/completions","body":{"prompt":"x","max_tokens":1e400}}', "invalid_request"),
    "huge int temperature": (json.dumps(_chat(temperature=10**400)).encode(), "invalid_request"),
    # `true` is not the neutral 1 of best_of
    "best_of true": (json.dumps(_chat(best_of=True)).encode(), "unsupported_field"),
}


@pytest.mark.parametrize("raw, code", list(REPORTED.values()), ids=list(REPORTED))
def test_reported_lines_become_error_rows(raw: bytes, code: str) -> None:
    row = parse_request(raw, 1)
    assert _code(row) == code
    assert len(row["request_error"]["message"]) < 400  # a huge value is not copied into the message
    batch = _one_row_batch(raw)
    assert batch.num_rows == 1
    assert batch.column("request_error").to_pylist()[0]["code"] == code


def test_neutral_values_are_still_accepted() -> None:
    row = parse_request(json.dumps(_chat(frequency_penalty=0.0, best_of=1, stream=False)).encode(), 1)
    assert _code(row) is None


def test_a_row_arrow_cannot_hold_becomes_an_error_row_and_keeps_the_others() -> None:
    # The safety net behind the checks: a row that still fails to convert is replaced alone.
    good = parse_request(json.dumps(_chat()).encode(), 1)
    bad = parse_request(json.dumps(_chat()).encode(), 2)
    bad["sampling_params"] = {"n": 2**64}  # as if a check had been missed
    batch = rows_to_request_batch([good, bad])
    errors = batch.column("request_error").to_pylist()
    assert errors[0] is None
    assert errors[1]["code"] == "invalid_request"
    assert batch.column("line").to_pylist() == [1, 2]
    assert batch.column("custom_id").to_pylist() == ["r1", None]


# --- the property: any JSON in any field --------------------------------------------------------

_HOSTILE_NUMBERS = st.sampled_from(
    [0, 1, -1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, 10**400, 0.5, -0.0, 1e300,
     math.nan, math.inf, -math.inf, 1.0, 4.0]
)
_HOSTILE_STRINGS = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "\ud83d", "a\udfffb", "\x00", "/v1/completions", CHAT_URL, "POST", "text",
                     "x" * 100_000, "user", "system"]),
)
_LEAF = st.one_of(st.none(), st.booleans(), _HOSTILE_NUMBERS, _HOSTILE_STRINGS)
_JSON = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(_HOSTILE_STRINGS, inner, max_size=4)
    ),
    max_leaves=12,
)
_BODY_KEYS = [
    "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
    "stop", "seed", "logprobs", "top_logprobs", "model", "stream", "frequency_penalty",
    "presence_penalty", "logit_bias", "echo", "best_of", "suffix", "response_format", "tools",
    "tool_choice", "parallel_tool_calls", "stream_options", "user", "metadata", "unknown_field",
    "min_tokens", "store", "service_tier",
]


def _valid_or(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, _JSON)


# Hostile values inside the nested fields too, not only in place of a whole field: a message's
# role, content and content parts, and response_format's type and json_schema members.
_PART = st.fixed_dictionaries(
    {"type": _valid_or(st.sampled_from(["text", "image_url", "input_audio"])), "text": _valid_or(st.text(max_size=10))},
    optional={"image_url": _JSON},
)
_MESSAGE = st.fixed_dictionaries(
    {
        "role": _valid_or(st.sampled_from(["system", "user", "assistant", "developer", "tool"])),
        "content": st.one_of(st.text(max_size=10), st.lists(st.one_of(_PART, _JSON), max_size=3), _JSON),
    },
    optional={"name": _JSON, "tool_calls": _JSON},
)
_RESPONSE_FORMAT = st.fixed_dictionaries(
    {"type": _valid_or(st.sampled_from(["text", "json_object", "json_schema"]))},
    optional={
        "json_schema": st.one_of(
            _JSON,
            st.fixed_dictionaries(
                {"name": _valid_or(st.text(max_size=8))},
                optional={
                    "schema": _valid_or(st.sampled_from([{"type": "object"}, {"type": "string", "pattern": "a+"}])),
                    "strict": _valid_or(st.booleans()),
                },
            ),
        )
    },
)
_NESTED_FIELDS = {
    "messages": st.lists(_MESSAGE, min_size=1, max_size=3),
    "response_format": _RESPONSE_FORMAT,
    "logit_bias": st.dictionaries(_HOSTILE_STRINGS, _LEAF, max_size=3),
    "stop": st.lists(_LEAF, max_size=3),
}


@st.composite
def _requests(draw: st.DrawFn) -> bytes:
    """A request line with some fields valid and others replaced by hostile JSON."""
    url = draw(st.sampled_from([CHAT_URL, COMPLETIONS_URL]))
    body: dict[str, Any] = {}
    if url == CHAT_URL:
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        body["prompt"] = "Once"
    for key in draw(st.lists(st.sampled_from(_BODY_KEYS), max_size=5, unique=True)):
        nested = _NESTED_FIELDS.get(key)
        body[key] = draw(_JSON if nested is None else st.one_of(nested, _JSON))
    request: dict[str, Any] = {"custom_id": "r", "method": "POST", "url": url, "body": body}
    for key in draw(st.lists(st.sampled_from(["custom_id", "method", "url", "body"]), max_size=2, unique=True)):
        request[key] = draw(_JSON)
    shape = draw(st.sampled_from(["object", "value", "nested"]))
    value: Any = request if shape == "object" else draw(_JSON)
    if shape == "nested":
        depth = draw(st.sampled_from([10, 900, 5_000]))
        return b"[" * depth + json.dumps(value).encode() + b"]" * depth
    # json.dumps writes NaN/Infinity tokens, huge ints and \\udXXX escapes as they are
    return json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_requests())
def test_any_line_is_a_request_or_an_error_row_never_an_exception(raw: bytes) -> None:
    row = parse_request(raw, 7)
    assert set(row) == {
        "custom_id", "prompt", "messages", "sampling_params", "request_error", "echo", "url", "model", "line"
    }
    batch = rows_to_request_batch([row])  # what the reader hands to the job
    assert batch.num_rows == 1
    assert batch.schema.names == list(OPENAI_COLUMNS.required_columns)
    if row["request_error"] is None:
        assert isinstance(row["custom_id"], str) and row["custom_id"]
        assert (row["messages"] is None) != (row["prompt"] is None)
        # a valid request holds only values Arrow stored as they are (a map comes back as pairs)
        stored = batch.to_pylist()[0]["sampling_params"]
        if stored is not None and stored["logit_bias"] is not None:
            stored["logit_bias"] = dict(stored["logit_bias"])
        assert stored == (
            None if row["sampling_params"] is None else {
                **dict.fromkeys(("n", "max_tokens", "temperature", "top_p", "seed", "stop", "logprobs",
                                 "presence_penalty", "frequency_penalty", "min_tokens", "logit_bias",
                                 "prompt_logprobs", "structured_outputs")),
                **row["sampling_params"],
            }
        )
        assert row["echo"] in (None, "echo", "prompt_only")
    else:
        assert row["prompt"] is None and row["messages"] is None and row["sampling_params"] is None


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_request_or_an_error_row(raw: bytes) -> None:
    row = parse_request(raw, 1)
    assert rows_to_request_batch([row]).num_rows == 1


# --- line length and bounded memory -------------------------------------------------------------

def test_lines_are_split_alike_whatever_the_chunking() -> None:
    text = b'\n  \n{"a": 1}\r\n\n' + b"x" * 3_000_000 + b"\nlast without newline"
    lines = list(iter_request_lines(io.BytesIO(text), 10 << 20))
    assert [line.data for line in lines] == [b'{"a": 1}\r', b"x" * 3_000_000, b"last without newline"]
    capped = list(iter_request_lines(io.BytesIO(text), 100))
    assert [line.data for line in capped] == [b'{"a": 1}\r', None, b"last without newline"]
    assert [line.num_bytes for line in capped] == [9, 3_000_000, 20]


def test_a_line_over_the_limit_is_an_error_row_and_memory_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    ok = json.dumps({"custom_id": "a", "url": COMPLETIONS_URL, "body": {"prompt": "hi"}})
    with path.open("wb") as handle:
        handle.write(ok.encode() + b"\n")
        # 64 MiB in one line, no newline at the end: read whole twice before the fix
        block = b"y" * (1 << 20)
        handle.write(b'{"custom_id": "b", "body": {"prompt": "')
        for _ in range(64):
            handle.write(block)
    tracemalloc.start()
    try:
        size, count, _ = request_file_identity(path)
        rows = [r for b in iter_openai_batches(path, 8, max_line_bytes=1 << 20) for r in b.to_pylist()]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 2 and size == path.stat().st_size
    assert [r["custom_id"] for r in rows] == ["a", None]
    assert rows[0]["request_error"] is None
    assert rows[1]["request_error"]["code"] == "line_too_long"
    assert "input.max_line_bytes = 1048576" in rows[1]["request_error"]["message"]
    assert peak < 16 << 20, f"peak {peak} bytes while reading a 64 MiB line"


# --- identity taken while reading ---------------------------------------------------------------

def _write_requests(path: Path, prompts: list[str]) -> None:
    lines = [json.dumps({"custom_id": f"r{i}", "url": COMPLETIONS_URL, "body": {"prompt": p}}) for i, p in enumerate(prompts)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_the_identity_of_the_read_is_the_planned_one(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    _write_requests(path, ["a", "b", "c"])
    info = inspect_openai_batch(path)
    assert info.footer_hash == hashlib.sha256(path.read_bytes()).hexdigest()
    rows = [r for b in iter_openai_batches(path, 2, expected=info.identity()) for r in b.to_pylist()]
    assert [r["prompt"] for r in rows] == ["a", "b", "c"]


def test_a_request_file_replaced_after_planning_is_refused_before_its_last_batch(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    _write_requests(path, ["a", "b", "c"])
    planned = inspect_openai_batch(path).identity()
    _write_requests(path, ["a", "B", "c"])  # same size, same line count, other content
    batches = iter_openai_batches(path, 2, expected=planned)
    first = next(batches)  # a batch is held until the file proved unchanged...
    assert first.num_rows == 2
    with pytest.raises(InputChangedError, match="changed after the job was planned"):
        next(batches)  # ...and the last one never comes


def test_an_expected_identity_of_another_row_count_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    _write_requests(path, ["a"])
    size, _, digest = request_file_identity(path)
    with pytest.raises(InputChangedError):
        list(iter_openai_batches(path, 4, expected=InputIdentity(str(path), size, 2, digest)))
