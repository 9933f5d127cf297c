"""Per-row `sampling_params` from hostile rows (issue 20): every value gives a valid request or an
`invalid_sampling_params` error row, never an exception -- as Python values and through a
Parquet column."""

from __future__ import annotations

import dataclasses
import functools
import math
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.sampling_params import MAX_STOP_CHARS, MAX_STOPS, SamplingParams
from batchgen.job.prepare import PreparedRow, RowPreparer
from tests.tiny_models import smollm2_tokenizer

FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]
HOSTILE_INTS = [0, 1, -1, 2, 20, 128, 129, 2**31, 2**63, -(2**63) - 1, 2**64, 10**30, 10**400, -(10**30), 10**5000]
HOSTILE_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 0.5, 1.0, 1.5, 1e-300, 1e300, 2.0**63, 7.0]
HOSTILE_STRINGS = ["x" * (MAX_STOP_CHARS + 1), "y" * 100_000, "", "stop", "1"]
HOSTILE_LISTS = [["s"] * (MAX_STOPS + 1), ["s"] * 10_000, [7] * (MAX_STOPS + 1), [[1, [2]], {"a": 1}], [], [1.0, 2.5], ["a", 1]]
HOSTILE_VALUES: list[Any] = [
    None, True, False, *HOSTILE_INTS, *HOSTILE_FLOATS, *HOSTILE_STRINGS, *HOSTILE_LISTS, {"a": 1}, {},
]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(HOSTILE_INTS),
    st.integers(),
    st.sampled_from(HOSTILE_FLOATS),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(HOSTILE_STRINGS),
)
_values = st.one_of(
    _scalars,
    st.lists(_scalars, max_size=4),
    st.sampled_from(HOSTILE_LISTS),
    st.dictionaries(st.text(max_size=3), _scalars, max_size=2),
)
_structs = st.dictionaries(st.sampled_from([*FIELDS, "bogus"]), _values, max_size=4)
num_python_examples = [0]
num_parquet_examples = [0]


def prepare(values: list[Any]) -> list[PreparedRow]:
    """Rows of prompt "hi" with these per-row sampling params (one preparer for the module)."""
    p = _preparer()
    rows = p.prepare(0, 0, list(range(len(values))), ["hi"] * len(values), None, values, [()] * len(values))
    p.forget_shard(0)
    return rows


@functools.lru_cache(maxsize=1)
def _preparer() -> RowPreparer:
    return RowPreparer(
        smollm2_tokenizer(),
        SamplingParams(max_tokens=4),
        max_model_len=64,
        prompt_too_long="error",
        job_seed=0,
        now=datetime(2026, 1, 1),
    )


def check_rows(rows: list[PreparedRow], num_rows: int) -> None:
    assert len(rows) == num_rows
    for row in rows:
        if row.error is not None:
            # a malformed structured_outputs has its own code (issue 22)
            structured = row.error.message.startswith("SamplingParams.structured_outputs")
            assert row.error.code == ("bad_structured_output" if structured else "invalid_sampling_params"), row.error
            assert row.params is None and row.token_ids is None
            continue
        params = row.params
        assert isinstance(params, SamplingParams) and row.token_ids
        # a valid request is one the engine can run: numbers it turns into floats convert
        for name in ("temperature", "top_p", "min_p"):
            assert math.isfinite(float(getattr(params, name)))
        assert len(params.stop_strings) <= MAX_STOPS and len(params.stop_token_ids) <= MAX_STOPS
        assert row.num_samples == params.n and isinstance(row.seed, int)


def test_every_field_with_every_hostile_value() -> None:
    values: list[Any] = [{name: value} for name in [*FIELDS, "bogus"] for value in HOSTILE_VALUES]
    values += HOSTILE_VALUES  # not a struct at all
    rows = prepare(values)
    check_rows(rows, len(values))


@settings(max_examples=300)
@given(st.lists(st.one_of(_structs, _values), min_size=1, max_size=3))
def test_hostile_sampling_params_give_rows_never_exceptions(values: list[Any]) -> None:
    num_python_examples[0] += 1
    rows = prepare(values)
    check_rows(rows, len(values))


@settings(max_examples=200)
@given(_structs)
def test_hostile_sampling_params_through_parquet(struct: dict[str, Any]) -> None:
    try:
        column = pa.array([struct, None])
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return  # pyarrow cannot hold it (mixed types, ints past 64 bits): no such Parquet file
    if not pa.types.is_struct(column.type):
        return
    sink = pa.BufferOutputStream()
    try:
        pq.write_table(pa.table({"sampling_params": column}), sink)
    except pa.ArrowNotImplementedError:
        return  # Parquet cannot write it (a struct without fields)
    values = pq.read_table(pa.BufferReader(sink.getvalue())).column("sampling_params").to_pylist()
    num_parquet_examples[0] += 1
    rows = prepare(values)
    check_rows(rows, 2)
    assert rows[1].error is None and rows[1].params == SamplingParams(max_tokens=4)


def test_caps_on_stop_lists_are_error_rows() -> None:
    values = [
        {"stop": ["s"] * MAX_STOPS},
        {"stop": ["s"] * (MAX_STOPS + 1)},
        {"stop": ["x" * MAX_STOP_CHARS]},
        {"stop": ["x" * (MAX_STOP_CHARS + 1)]},
        {"stop": "x" * (MAX_STOP_CHARS + 1)},
        {"stop_token_ids": [7] * (MAX_STOPS + 1)},
        {"temperature": 10**400},
    ]
    rows = prepare(values)
    assert [r.error.message if r.error else None for r in rows] == [
        None,
        f"SamplingParams.stop may hold at most {MAX_STOPS} entries, got {MAX_STOPS + 1}",
        None,
        f"SamplingParams.stop strings may be at most {MAX_STOP_CHARS} characters long, got one of {MAX_STOP_CHARS + 1}",
        f"SamplingParams.stop strings may be at most {MAX_STOP_CHARS} characters long, got one of {MAX_STOP_CHARS + 1}",
        f"SamplingParams.stop_token_ids may hold at most {MAX_STOPS} entries, got {MAX_STOPS + 1}",
        "SamplingParams.temperature must be a finite number >= 0, got an integer of 1329 bits",
    ]
    assert all(r.error is None or r.error.code == "invalid_sampling_params" for r in rows)
