"""The fixed output schema of a job and the mapping from input columns to roles.

Owns: `ColumnMap` (which input column is the id, the prompt or the messages, the per-row
sampling parameters, the passthrough columns), `OutputRow` (one finished sample, plain Python
values) and `output_schema` / `rows_to_batch`, which turn rows into Arrow record batches.

Invariants:
- Output columns, in order: ``id``, ``sample_index``, the passthrough columns (their input
  types), ``output``, ``finish_reason``, ``stop_reason``,
  ``usage{prompt_tokens, completion_tokens, cached_tokens}``, ``error{code, message}``, ``seed``,
  then optionally ``output_token_ids`` and ``logprobs``. A scoring job (``task: score``) has
  ``score_logprob_sum`` (float64, natural log), ``score_num_tokens`` (int32) and
  ``score_perplexity`` (float64, exp(-sum / num_tokens)) after ``seed``, then optionally
  ``output_token_ids`` (the completion's tokens) and ``score_token_logprobs`` (list<float32>);
  its rows have finish_reason "scored", ``output`` null, ``usage.completion_tokens`` the
  number of tokens scored.
- Types are fixed up front from the input's id type and passthrough types: a success row and an
  error row have the same types, so any mix of them forms one batch and one shard.
- ``error`` is null exactly on success rows (``finish_reason`` "stop", "length" or "scored");
  the score columns are null on error rows;
  ``usage`` is never null.
- A passthrough column may not carry the name of an output column.

May import: the standard library and pyarrow. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "FINISH_REASONS",
    "OUTPUT_COLUMNS",
    "SCORE_COLUMNS",
    "ColumnMap",
    "EchoPrompt",
    "OutputRow",
    "output_schema",
    "passthrough_fields",
    "rows_to_batch",
]

FINISH_REASONS = ("stop", "length", "scored", "error")
SCORE_COLUMNS = ("score_logprob_sum", "score_num_tokens", "score_perplexity", "score_token_logprobs")

# Every name the output schema may use; passthrough columns must avoid all of them.
OUTPUT_COLUMNS = (
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
    *SCORE_COLUMNS,
)

_USAGE_TYPE = pa.struct(
    [
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("cached_tokens", pa.int32()),
    ]
)
_ERROR_TYPE = pa.struct([pa.field("code", pa.string()), pa.field("message", pa.string())])
_TOKEN_IDS_TYPE = pa.list_(pa.int32())
_LOGPROBS_TYPE = pa.list_(pa.float32())


def _check_name(role: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{role}: expected a non-empty column name, got {value!r}")


@dataclass(frozen=True, slots=True)
class ColumnMap:
    """Names of the input columns by role.

    `prompt` holds plain text; `messages` holds a chat (a list of ``{role, content}``);
    `prompt_token_ids` holds prompts already tokenized (a list of integers). Exactly one of the
    three is set, except when `row_error` is set: that struct<code, message> column comes from
    readers of non-tabular inputs (OpenAI batch JSONL), which may set both `prompt` and
    `messages`, each row using the one that is not null; a row whose `row_error` is not null
    becomes an error row. `sampling_params`, when set, is a struct column of per-row overrides.
    `passthrough` columns are copied to the output unchanged, in this order.
    `completion` (scoring jobs) holds the text scored after each row's prompt, or a whole chat
    whose last (assistant) message is scored; with it, at most one prompt role is set (none
    when the completions are chats). `echo` (from the OpenAI batch reader) marks the rows that
    echo their prompt: "echo" (prompt, then the output) or "prompt_only" (max_tokens 0).
    Raises ValueError on an empty name, a wrong number of prompt roles, a repeated
    passthrough name or a passthrough name that an output column already uses.
    """

    id: str = "id"
    prompt: str | None = "prompt"
    messages: str | None = None
    sampling_params: str | None = None
    passthrough: tuple[str, ...] = ()
    prompt_token_ids: str | None = None
    row_error: str | None = None
    completion: str | None = None
    echo: str | None = None

    def __post_init__(self) -> None:
        _check_name("columns.id", self.id)
        roles = [r for r in (self.prompt, self.messages, self.prompt_token_ids) if r is not None]
        if self.completion is not None:
            if len(roles) > 1:
                raise ValueError(
                    "columns: a scoring job takes at most one of 'prompt', 'messages' and "
                    f"'prompt_token_ids' besides 'completion', got prompt={self.prompt!r}, "
                    f"messages={self.messages!r}, prompt_token_ids={self.prompt_token_ids!r}"
                )
        elif self.row_error is None and len(roles) != 1:
            raise ValueError(
                "columns: set exactly one of 'prompt' and 'messages' (or 'prompt_token_ids' "
                f"alone), got prompt={self.prompt!r}, messages={self.messages!r}, "
                f"prompt_token_ids={self.prompt_token_ids!r}"
            )
        if not roles and self.completion is None:
            raise ValueError("columns: set at least one of 'prompt' and 'messages'")
        for role in ("prompt", "messages", "prompt_token_ids", "sampling_params", "row_error", "completion", "echo"):
            value = getattr(self, role)
            if value is not None:
                _check_name(f"columns.{role}", value)
        if not isinstance(self.passthrough, tuple):
            raise ValueError(
                f"columns.passthrough: expected a tuple of column names, got {self.passthrough!r}"
            )
        for name in self.passthrough:
            _check_name("columns.passthrough", name)
        _check_passthrough_names(self.passthrough)

    @property
    def text_column(self) -> str:
        """The prompt column, else the messages column (chats), else the token-id column (else
        the completion column, for scores of whole chats)."""
        for name in (self.prompt, self.messages, self.prompt_token_ids, self.completion):
            if name is not None:
                return name
        raise AssertionError("__post_init__ guarantees a prompt role")

    @property
    def required_columns(self) -> tuple[str, ...]:
        """The input columns to read: id, the prompt roles, sampling_params, row_error,
        passthrough."""
        names = [self.id]
        names += [n for n in (self.prompt, self.messages, self.prompt_token_ids) if n is not None]
        for name in (self.completion, self.sampling_params, self.row_error, self.echo):
            if name is not None:
                names.append(name)
        names.extend(self.passthrough)
        return tuple(dict.fromkeys(names))


def _check_passthrough_names(names: Sequence[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in OUTPUT_COLUMNS:
            raise ValueError(
                f"columns.passthrough: column {name!r} has the name of an output column; "
                f"output columns are {', '.join(OUTPUT_COLUMNS)}"
            )
        if name in seen:
            raise ValueError(f"columns.passthrough: column {name!r} is listed twice")
        seen.add(name)


@dataclass(frozen=True, slots=True)
class EchoPrompt:
    """A prompt echoed in a response line (OpenAI's ``echo``): its text and tokens and, when
    log-probabilities were asked, each token's (None for the first) and its top ones, best
    first (None for the first)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float | None, ...] | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...] | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class OutputRow:
    """One output row: one sample of one input row, as plain Python values.

    `passthrough` holds the passthrough values in `ColumnMap.passthrough` order. Token counts
    are per sample. An error row has finish_reason "error" and an `error_code`; any other row
    has neither. Raises ValueError when that does not hold.
    """

    id: int | str | None
    sample_index: int
    passthrough: tuple[Any, ...]
    output: str | None
    finish_reason: str
    stop_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error_code: str | None
    error_message: str | None
    seed: int
    output_token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    # Per generated token, the top (token id, log-probability) pairs, best first, when the
    # request asked for top log-probabilities; for response lines only, not a Parquet column.
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None
    # A score row's per-token log-probabilities (float64; the score columns derive from them).
    score_token_logprobs: tuple[float, ...] | None = None
    # The prompt to echo before the output (response lines only).
    echo: EchoPrompt | None = None

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"OutputRow.finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}"
            )
        if (self.finish_reason == "error") != (self.error_code is not None):
            raise ValueError(
                "OutputRow: finish_reason 'error' goes with an error_code and only with one, "
                f"got finish_reason={self.finish_reason!r}, error_code={self.error_code!r}"
            )

    @property
    def is_error(self) -> bool:
        return self.error_code is not None


def output_schema(
    id_type: pa.DataType,
    passthrough: pa.Schema,
    *,
    with_token_ids: bool,
    with_logprobs: bool,
    is_score: bool = False,
) -> pa.Schema:
    """The output schema for an input with this id type and these passthrough fields (a
    scoring job's with `is_score`: the score columns, and `with_logprobs` gives
    ``score_token_logprobs`` instead of ``logprobs``).

    Raises ValueError when id_type is neither an integer nor a string type, or when a
    passthrough field is named like an output column.
    """
    if not (
        pa.types.is_integer(id_type)
        or pa.types.is_string(id_type)
        or pa.types.is_large_string(id_type)
    ):
        raise ValueError(f"output_schema: id must be an integer or string type, got {id_type}")
    _check_passthrough_names(passthrough.names)
    fields = [pa.field("id", id_type), pa.field("sample_index", pa.int32())]
    fields.extend(pa.field(f.name, f.type) for f in passthrough)
    fields += [
        pa.field("output", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("stop_reason", pa.string()),
        pa.field("usage", _USAGE_TYPE),
        pa.field("error", _ERROR_TYPE),
        pa.field("seed", pa.int64()),
    ]
    if is_score:
        fields += [
            pa.field("score_logprob_sum", pa.float64()),
            pa.field("score_num_tokens", pa.int32()),
            pa.field("score_perplexity", pa.float64()),
        ]
    if with_token_ids:
        fields.append(pa.field("output_token_ids", _TOKEN_IDS_TYPE))
    if with_logprobs:
        fields.append(pa.field("score_token_logprobs" if is_score else "logprobs", _LOGPROBS_TYPE))
    return pa.schema(fields)


def passthrough_fields(schema: pa.Schema) -> list[pa.Field]:
    """The passthrough fields of an output schema, in order."""
    return [f for f in schema if f.name not in OUTPUT_COLUMNS]


def rows_to_batch(rows: Sequence[OutputRow], schema: pa.Schema) -> pa.RecordBatch:
    """Build one record batch of `schema` (from `output_schema`) from rows, in row order.

    Optional columns present in the schema hold null for rows without the values. Raises
    ValueError when a row's passthrough values do not match the schema's passthrough fields,
    and pyarrow's ArrowInvalid/ArrowTypeError when a value does not fit its column's type.
    """
    extra = passthrough_fields(schema)
    for row in rows:
        if len(row.passthrough) != len(extra):
            raise ValueError(
                f"rows_to_batch: row {row.id!r} has {len(row.passthrough)} passthrough values, "
                f"the schema has {len(extra)} passthrough columns"
            )
    columns: dict[str, list[Any]] = {
        "id": [r.id for r in rows],
        "sample_index": [r.sample_index for r in rows],
        "output": [r.output for r in rows],
        "finish_reason": [r.finish_reason for r in rows],
        "stop_reason": [r.stop_reason for r in rows],
        "usage": [
            {
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "cached_tokens": r.cached_tokens,
            }
            for r in rows
        ],
        "error": [
            None if r.error_code is None else {"code": r.error_code, "message": r.error_message}
            for r in rows
        ],
        "seed": [r.seed for r in rows],
        "output_token_ids": [
            None if r.output_token_ids is None else list(r.output_token_ids) for r in rows
        ],
        "logprobs": [None if r.logprobs is None else list(r.logprobs) for r in rows],
    }
    if "score_logprob_sum" in schema.names:
        scores = [r.score_token_logprobs for r in rows]
        sums = [None if s is None else math.fsum(s) for s in scores]
        columns["score_logprob_sum"] = sums
        columns["score_num_tokens"] = [None if s is None else len(s) for s in scores]
        columns["score_perplexity"] = [
            None if s is None or total is None or not s else math.exp(-total / len(s))
            for s, total in zip(scores, sums, strict=True)
        ]
        columns["score_token_logprobs"] = [None if s is None else list(s) for s in scores]
    for idx, field in enumerate(extra):
        columns[field.name] = [r.passthrough[idx] for r in rows]
    arrays = [pa.array(columns[f.name], type=f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
