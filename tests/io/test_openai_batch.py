"""OpenAI batch request lines -> rows (every line a row, problems as row errors), the streamed
reader, the atomic response writer and its summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchgen.io import InputError, InputIdentity
from batchgen.io.jsonl_writer import JsonlShardWriter, summarize_openai_output
from batchgen.io.openai_batch import (
    OPENAI_COLUMNS,
    count_requests,
    inspect_openai_batch,
    iter_openai_batches,
    parse_request,
)


def _line(custom_id: Any = "r1", url: str = "/v1/chat/completions", **body: Any) -> bytes:
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode()


def _error(row: dict[str, Any]) -> tuple[str, str] | None:
    error = row["request_error"]
    return None if error is None else (error["code"], error["message"])


def test_chat_request_maps_body_fields_onto_sampling_params() -> None:
    row = parse_request(
        _line(
            model="gpt-4o-mini",
            max_completion_tokens=7,
            temperature=0.5,
            top_p=0.9,
            n=2,
            stop="\n",
            seed=3,
            logprobs=True,
            user="someone",
            frequency_penalty=0,
            response_format={"type": "text"},
        ),
        4,
    )
    assert _error(row) is None
    assert row["custom_id"] == "r1" and row["model"] == "gpt-4o-mini" and row["line"] == 4
    assert row["messages"] == [{"role": "user", "content": "Hi"}] and row["prompt"] is None
    assert row["sampling_params"] == {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "n": 2,
        "stop": ["\n"],
        "seed": 3,
        "logprobs": 0,
        "frequency_penalty": 0.0,
    }


def test_completion_request_and_text_parts() -> None:
    row = parse_request(
        json.dumps(
            {"custom_id": "c", "url": "/v1/completions", "body": {"prompt": ["Once"], "max_tokens": 4.0, "logprobs": 0}}
        ).encode(),
        1,
    )
    assert _error(row) is None
    assert row["prompt"] == "Once" and row["messages"] is None
    assert row["sampling_params"] == {"max_tokens": 4, "logprobs": 0}
    row = parse_request(_line(logprobs=True, top_logprobs=2), 1)
    assert row["sampling_params"] == {"logprobs": 2}
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    row = parse_request(_line(messages=[{"role": "user", "content": parts}]), 1)
    assert row["messages"] == [{"role": "user", "content": "ab"}]


@pytest.mark.parametrize(
    ("raw", "code", "message"),
    [
        (b"{not json", "invalid_json", "line 9 is not valid JSON"),
        (b'"a string"', "invalid_request", "line 9 is not a JSON object"),
        (b'{"custom_id": "x", "url": "/v1/chat/completions", "body": {"messages": []}}', "invalid_request", "non-empty list"),
        (_line(url="/v1/embeddings"), "unsupported_url", "url '/v1/embeddings' is not supported"),
        (_line(custom_id=None), "missing_custom_id", "line 9 has no custom_id"),
        (_line(custom_id=""), "missing_custom_id", "line 9 has no custom_id"),
        (_line(best_of=2), "unsupported_field", "body.best_of=2 is not supported"),
        (_line(echo=True), "unsupported_field", "body.echo=true is not supported"),
        (_line(logit_bias={"x": 1}), "invalid_request", "body.logit_bias keys must be token ids, got 'x'"),
        (_line(logit_bias={"5": "big"}), "invalid_request", "body.logit_bias[5] must be a number"),
        (_line(logit_bias=[1]), "invalid_request", "body.logit_bias must be an object"),
        (_line(tools=[{"type": "function"}]), "unsupported_field", "body.tools="),
        (_line(stream=True), "unsupported_field", "body.stream=true"),
        (_line(top_k=3), "unsupported_field", "body.top_k is not supported"),
        (_line(top_logprobs=2), "invalid_request", "needs body.logprobs: true"),
        (_line(max_tokens=3, max_completion_tokens=4), "invalid_request", "differ"),
        (_line(temperature="hot"), "invalid_request", "body.temperature must be a number"),
        (_line(messages=[{"role": "user", "content": "x", "name": "bob"}]), "unsupported_field", "messages[0].name"),
        (b'{"custom_id": "x", "url": "/v1/completions", "body": {"prompt": ["a", "b"]}}', "unsupported_field", "one text prompt"),
        (b'{"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {"prompt": "a"}}', "invalid_request", "POST"),
        (b'{"custom_id": "x\xff", "url": "/v1/completions", "body": {"prompt": "a"}}', "invalid_utf8", "not valid UTF-8"),
    ],
)
def test_malformed_lines_become_row_errors(raw: bytes, code: str, message: str) -> None:
    row = parse_request(raw, 9)
    error = _error(row)
    assert error is not None and error[0] == code and message in error[1]
    assert row["line"] == 9
    assert row["prompt"] is None and row["messages"] is None and row["sampling_params"] is None


def test_reader_streams_one_row_per_non_blank_line(tmp_path: Path) -> None:
    path = tmp_path / "req.jsonl"
    lines = [_line(custom_id=f"r{i}") for i in range(5)]
    path.write_bytes(b"\n".join([*lines[:2], b"", b"garbage", *lines[2:]]) + b"\n\n")
    assert count_requests(path) == 6
    info = inspect_openai_batch(path)
    assert (info.name, info.num_rows) == ("req.jsonl", 6)
    batches = list(iter_openai_batches(path, 4))
    assert [b.num_rows for b in batches] == [4, 2]
    assert all(b.schema.names == list(OPENAI_COLUMNS.required_columns) for b in batches)
    ids = [x for b in batches for x in b.column(0).to_pylist()]
    assert ids == ["r0", "r1", None, "r2", "r3", "r4"]
    lines_col = [x for b in batches for x in b.column(b.schema.get_field_index("line")).to_pylist()]
    assert lines_col == [1, 2, 3, 4, 5, 6]
    with pytest.raises(InputError, match="does not exist"):
        inspect_openai_batch(tmp_path / "missing.jsonl")


def test_writer_commits_atomically_and_aborts_cleanly(tmp_path: Path) -> None:
    with JsonlShardWriter(tmp_path, "out.jsonl") as writer:
        writer.write([{"a": 1}])
        assert not (tmp_path / "out.jsonl").exists()
        assert len(list(tmp_path.glob(".out.jsonl.tmp-*"))) == 1
    assert list(tmp_path.iterdir()) == []  # aborted on exit, nothing left
    writer = JsonlShardWriter(tmp_path, "out.jsonl")
    ok = {
        "custom_id": "a",
        "response": {"body": {"usage": {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}}},
        "error": None,
    }
    bad = {"custom_id": None, "response": None, "error": {"code": "invalid_json", "message": "m"}}
    writer.write([ok, bad])
    writer.write([ok])
    path = writer.commit()
    assert [json.loads(x)["custom_id"] for x in path.read_text().splitlines()] == ["a", None, "a"]
    assert list(tmp_path.iterdir()) == [path]
    with pytest.raises(ValueError, match="already committed"):
        writer.write([ok])
    record = summarize_openai_output(path, input=InputIdentity("req.jsonl", 0, 3, ""))
    assert record.rows_by_status == {"ok": 2, "error": 1}
    assert record.error_codes == {"invalid_json": 1}
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (10, 4, 8)


def test_penalties_logit_bias_and_min_tokens_are_honoured() -> None:
    row = parse_request(
        _line(frequency_penalty=0.5, presence_penalty=-1, logit_bias={"50256": -100, "7": 2.5}, min_tokens=3), 1
    )
    assert _error(row) is None
    assert row["sampling_params"] == {
        "frequency_penalty": 0.5,
        "presence_penalty": -1.0,
        "logit_bias": {50256: -100.0, 7: 2.5},
        "min_tokens": 3,
    }
    assert row["echo"] is None
    batch = iter_batch([_line(logit_bias={"50256": -100}, min_tokens=2)])
    assert batch.column("sampling_params").to_pylist()[0]["logit_bias"] == [(50256, -100.0)]


def iter_batch(lines: list[bytes]) -> Any:
    from batchgen.io.openai_batch import rows_to_request_batch

    return rows_to_request_batch([parse_request(raw, i + 1) for i, raw in enumerate(lines)])


def _completion(**body: Any) -> bytes:
    return json.dumps({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "Once", **body}}).encode()


@pytest.mark.parametrize(
    ("body", "echo", "params"),
    [
        ({"echo": True, "max_tokens": 0, "logprobs": 1}, "prompt_only", {"prompt_logprobs": 1}),
        ({"echo": True, "max_tokens": 0}, "prompt_only", None),
        ({"echo": True, "max_tokens": 4, "logprobs": 2}, "echo", {"max_tokens": 4, "logprobs": 2, "prompt_logprobs": 2}),
        ({"echo": True, "max_tokens": 4}, "echo", {"max_tokens": 4}),
        ({"echo": False, "max_tokens": 4}, None, {"max_tokens": 4}),
    ],
)
def test_echo_requests(body: dict[str, Any], echo: str | None, params: dict[str, Any] | None) -> None:
    row = parse_request(_completion(**body), 1)
    assert _error(row) is None
    assert (row["echo"], row["sampling_params"]) == (echo, params)


def test_max_tokens_zero_without_echo_is_left_to_sampling_params() -> None:
    row = parse_request(_completion(max_tokens=0), 1)
    assert _error(row) is None and row["sampling_params"] == {"max_tokens": 0}  # an error row later
    assert _error(parse_request(_completion(echo="yes"), 1)) == ("invalid_request", "body.echo must be true or false, got 'yes'")
