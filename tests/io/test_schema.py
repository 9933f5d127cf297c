"""The output schema: exact names and types, one type for success and error rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from batchgen.io import ColumnMap, OutputRow, output_schema, rows_to_batch

USAGE = pa.struct(
    [
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("cached_tokens", pa.int32()),
    ]
)
ERROR = pa.struct([pa.field("code", pa.string()), pa.field("message", pa.string())])


def _row(**changes: object) -> OutputRow:
    values: dict[str, object] = {
        "id": 7,
        "sample_index": 0,
        "passthrough": ("en", 3),
        "output": "hello",
        "finish_reason": "stop",
        "stop_reason": None,
        "prompt_tokens": 12,
        "completion_tokens": 2,
        "cached_tokens": 8,
        "error_code": None,
        "error_message": None,
        "seed": 1234,
    }
    values.update(changes)
    return OutputRow(**values)


PASSTHROUGH = pa.schema([pa.field("lang", pa.string()), pa.field("level", pa.int16())])


def test_output_schema_names_and_types() -> None:
    schema = output_schema(pa.int64(), PASSTHROUGH, with_token_ids=False, with_logprobs=False)
    assert [(f.name, f.type) for f in schema] == [
        ("id", pa.int64()),
        ("sample_index", pa.int32()),
        ("lang", pa.string()),
        ("level", pa.int16()),
        ("output", pa.string()),
        ("finish_reason", pa.string()),
        ("stop_reason", pa.string()),
        ("usage", USAGE),
        ("error", ERROR),
        ("seed", pa.int64()),
    ]


def test_output_schema_optional_columns_and_string_id() -> None:
    schema = output_schema(
        pa.large_string(), pa.schema([]), with_token_ids=True, with_logprobs=True
    )
    assert schema.names == [
        "id",
        "sample_index",
        "output",
        "finish_reason",
        "stop_reason",
        "usage",
        "error",
        "seed",
        "output_token_ids",
        "logprobs",
    ]
    assert schema.field("id").type == pa.large_string()
    assert schema.field("output_token_ids").type == pa.list_(pa.int32())
    assert schema.field("logprobs").type == pa.list_(pa.float32())
    only_logprobs = output_schema(
        pa.int32(), pa.schema([]), with_token_ids=False, with_logprobs=True
    )
    assert only_logprobs.names[-2:] == ["seed", "logprobs"]


def test_passthrough_named_like_output_column_is_rejected() -> None:
    clash = pa.schema([pa.field("lang", pa.string()), pa.field("output", pa.string())])
    with pytest.raises(ValueError, match="'output'"):
        output_schema(pa.int64(), clash, with_token_ids=False, with_logprobs=False)
    with pytest.raises(ValueError, match="'usage'"):
        ColumnMap(passthrough=("usage",))


def test_output_schema_rejects_float_id() -> None:
    with pytest.raises(ValueError, match="integer or string"):
        output_schema(pa.float64(), pa.schema([]), with_token_ids=False, with_logprobs=False)


def test_success_and_error_rows_share_one_batch_and_types() -> None:
    schema = output_schema(pa.int64(), PASSTHROUGH, with_token_ids=True, with_logprobs=True)
    ok = _row(output_token_ids=(5, 6), logprobs=(-0.5, -1.25))
    bad = _row(
        id=8,
        sample_index=1,
        passthrough=(None, 4),
        output=None,
        finish_reason="error",
        prompt_tokens=0,
        completion_tokens=0,
        cached_tokens=0,
        error_code="prompt_too_long",
        error_message="prompt has 5000 tokens, max_model_len is 2048",
    )
    batch = rows_to_batch([ok, bad], schema)
    assert batch.schema.equals(schema)
    assert batch.to_pylist() == [
        {
            "id": 7,
            "sample_index": 0,
            "lang": "en",
            "level": 3,
            "output": "hello",
            "finish_reason": "stop",
            "stop_reason": None,
            "usage": {"prompt_tokens": 12, "completion_tokens": 2, "cached_tokens": 8},
            "error": None,
            "seed": 1234,
            "output_token_ids": [5, 6],
            "logprobs": [-0.5, -1.25],
        },
        {
            "id": 8,
            "sample_index": 1,
            "lang": None,
            "level": 4,
            "output": None,
            "finish_reason": "error",
            "stop_reason": None,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0},
            "error": {
                "code": "prompt_too_long",
                "message": "prompt has 5000 tokens, max_model_len is 2048",
            },
            "seed": 1234,
            "output_token_ids": None,
            "logprobs": None,
        },
    ]
    # each row alone gives the same types as the mix
    assert rows_to_batch([ok], schema).schema.equals(rows_to_batch([bad], schema).schema)
    assert rows_to_batch([], schema).num_rows == 0


def test_rows_to_batch_checks_passthrough_arity() -> None:
    schema = output_schema(pa.int64(), PASSTHROUGH, with_token_ids=False, with_logprobs=False)
    with pytest.raises(ValueError, match="1 passthrough values"):
        rows_to_batch([_row(passthrough=("en",))], schema)


def test_output_row_error_consistency() -> None:
    with pytest.raises(ValueError, match="finish_reason"):
        _row(finish_reason="eos")
    with pytest.raises(ValueError, match="error_code"):
        _row(finish_reason="error")
    with pytest.raises(ValueError, match="error_code"):
        _row(error_code="boom")


def test_column_map_roles() -> None:
    assert ColumnMap().required_columns == ("id", "prompt")
    chat = ColumnMap(
        id="row",
        prompt=None,
        messages="conv",
        sampling_params="sp",
        passthrough=("lang", "row", "conv"),
    )
    assert chat.required_columns == ("row", "conv", "sp", "lang")
    assert chat.text_column == "conv"
    with pytest.raises(ValueError, match="exactly one"):
        ColumnMap(messages="conv")
    with pytest.raises(ValueError, match="exactly one"):
        ColumnMap(prompt=None)
    with pytest.raises(ValueError, match="listed twice"):
        ColumnMap(passthrough=("a", "a"))
    with pytest.raises(ValueError, match=r"columns\.id"):
        ColumnMap(id="")


def test_passthrough_values_of_nested_types_round_trip() -> None:
    # the pipeline takes passthrough values from input batches with to_pylist()
    source = pa.table(
        {
            "meta": pa.array(
                [{"a": 1, "b": ["x"]}, None],
                pa.struct([("a", pa.int8()), ("b", pa.list_(pa.string()))]),
            ),
            "when": pa.array([0, 1_700_000_000_000_000], pa.timestamp("us", tz="UTC")),
            "tags": pa.array([["p", "q"], []], pa.large_list(pa.string())),
        }
    )
    schema = output_schema(pa.string(), source.schema, with_token_ids=False, with_logprobs=False)
    rows = [
        _row(id=str(i), passthrough=tuple(source.column(n)[i].as_py() for n in source.column_names))
        for i in range(2)
    ]
    batch = rows_to_batch(rows, schema)
    for name in source.column_names:
        assert batch.column(name).equals(source.column(name).combine_chunks())
