"""`batchgen.generate(table, ...)`: the job pipeline over an in-memory Arrow table (or polars, or pandas).

The table goes through the same prepare / order / engine / write stages as `batchgen run`, as one
shard; the result is the input table with the output columns appended, rows in input order
(`n` > 1 repeats each row once per sample). polars is imported only when a polars frame comes in; a pandas frame comes back as pandas.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from batchgen.engine.config import engine_configs
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.io import ColumnMap, OutputRow, output_schema, plain_type, rows_to_batch
from batchgen.job.pipeline import run_pipeline_sync
from batchgen.job.prepare import RowPreparer
from batchgen.job.stages import PipelineOptions, ShardMeta, ShardStats
from batchgen.models.checkpoint import load_checkpoint
from batchgen.tokenizer.chat_options import ChatOptions

__all__ = ["TableGenerator", "generate"]

_ROW_ID = "__batchgen_row_id"


class _TableSource:
    def __init__(self, table: pa.Table, batch_rows: int) -> None:
        self._table = table
        self._batch_rows = batch_rows

    def iter_batches(self, shard: ShardMeta) -> Iterator[pa.RecordBatch]:
        return iter(self._table.to_batches(max_chunksize=self._batch_rows))


class _TableSink:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.batches: list[pa.RecordBatch] = []

    def write(self, shard: ShardMeta, rows: Sequence[OutputRow]) -> None:
        self.batches.append(rows_to_batch(rows, self.schema))

    def commit(self, shard: ShardMeta, stats: ShardStats) -> None:
        pass  # nothing to make durable in memory

    def discard(self, shard: ShardMeta) -> None:
        self.batches.clear()  # the table is the only shard

    def abort(self) -> None:
        self.batches.clear()


class TableGenerator:
    """The model and engine loaded once, for many tables (`generate` uses one per call; a Ray
    Data stage keeps one per actor). Arguments as for `generate`, except the table."""

    def __init__(
        self,
        *,
        model: str | None = None,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        prompt_column: str = "prompt",
        messages_column: str | None = None,
        prompt_token_ids_column: str | None = None,
        sampling_params_column: str | None = None,
        id_column: str | None = None,
        seed: int = 0,
        prompt_too_long: str = "error",
        order: str = "prefix",
        window_rows: int = 1024,
        max_error_rate: float = 1.0,
        include_token_ids: bool = False,
        include_logprobs: bool = False,
        use_tqdm: bool = True,
        chat: ChatOptions | Mapping[str, Any] | None = None,
        **engine_options: Any,
    ) -> None:
        engine_config = engine_configs(engine_options)
        if order not in ("prefix", "input"):
            raise ValueError(f"order must be 'prefix' or 'input', got {order!r}")
        if prompt_too_long not in ("error", "truncate_left", "truncate_right"):
            raise ValueError(f"prompt_too_long must be error, truncate_left or truncate_right, got {prompt_too_long!r}")
        self._params = sampling if isinstance(sampling, SamplingParams) else SamplingParams.from_mapping(sampling or {})
        chat_options = chat if isinstance(chat, ChatOptions) else ChatOptions.from_mapping(chat or {})
        uses_prompt = messages_column is None and prompt_token_ids_column is None
        self._prompt_column = prompt_column if uses_prompt else None
        self._messages_column = messages_column
        self._prompt_token_ids_column = prompt_token_ids_column
        self._sampling_params_column = sampling_params_column
        self._id_column = id_column
        self._include_token_ids = include_token_ids
        self._include_logprobs = include_logprobs
        checkpoint = load_checkpoint(model)
        self._engine = LLMEngine.from_configs(checkpoint, engine_config, seed=seed)
        if self._params.structured is not None:  # a rejected schema fails the call, not each row
            self._engine.structured.compile(self._params.structured)
        self._preparer = RowPreparer(
            checkpoint.tokenizer,
            self._params,
            max_model_len=self._engine.max_model_len,
            prompt_too_long=prompt_too_long,  # type: ignore[arg-type]
            job_seed=seed,
            now=datetime.now(),
            chat=chat_options,
        )
        self._options = PipelineOptions(
            columns=ColumnMap(
                id=id_column or _ROW_ID,
                prompt=self._prompt_column,
                messages=messages_column,
                prompt_token_ids=prompt_token_ids_column,
                sampling_params=sampling_params_column,
            ),
            batch_rows=1024,
            order=order,
            window_rows=window_rows,
            max_error_rate=max_error_rate,
            min_rows_for_error_rate=100,
            include_token_ids=include_token_ids,
            include_logprobs=include_logprobs,
            use_tqdm=use_tqdm,
        )

    def __call__(self, table: Any) -> Any:
        """Generate for every row of `table` (a pyarrow.Table, polars.DataFrame or
        pandas.DataFrame); see `generate`."""
        kind = type(table).__module__.split(".")[0]
        if kind == "polars":
            arrow: pa.Table = table.to_arrow()
        elif kind == "pandas" and type(table).__name__ == "DataFrame":
            arrow = pa.Table.from_pandas(table, preserve_index=False)
        else:
            arrow = table
        if not isinstance(arrow, pa.Table):
            raise TypeError(
                "generate() takes a pyarrow.Table, a polars.DataFrame or a pandas.DataFrame, "
                f"got {type(table).__name__}"
            )
        needed = [
            c
            for c in (
                self._prompt_column,
                self._messages_column,
                self._prompt_token_ids_column,
                self._sampling_params_column,
            )
            if c
        ]
        missing = [c for c in [*needed, self._id_column] if c and c not in arrow.column_names]
        if missing:
            raise ValueError(f"the table has no column {missing[0]!r}; its columns: {', '.join(arrow.column_names)}")
        if self._sampling_params_column is not None:
            _check_sampling_struct(arrow.schema.field(self._sampling_params_column), self._sampling_params_column)
        if self._id_column is None:
            # Rows are keyed by position; the input columns are put back from the input table at
            # the end, so none of them needs to travel through the pipeline.
            id_type = pa.int64()
            work = pa.table({_ROW_ID: pa.array(range(arrow.num_rows), pa.int64())})
        else:
            id_type = plain_type(arrow.schema.field(self._id_column).type)
            if not (pa.types.is_integer(id_type) or pa.types.is_string(id_type) or pa.types.is_large_string(id_type)):
                raise ValueError(f"id column {self._id_column!r}: expected integers or strings, got {id_type}")
            work = pa.table({self._id_column: arrow.column(self._id_column).cast(id_type)})
        for name in needed:
            work = work.append_column(name, arrow.column(name))
        passthrough_schema = pa.schema([])
        schema = output_schema(
            id_type, passthrough_schema, with_token_ids=self._include_token_ids, with_logprobs=self._include_logprobs
        )
        shard = ShardMeta(
            index=0, name="table", num_rows=arrow.num_rows, input_path="<table>", id_type=id_type, passthrough=passthrough_schema
        )
        sink = _TableSink(schema)
        run_pipeline_sync(self._engine, self._preparer, _TableSource(work, 1024), sink, [shard], self._options)
        out = pa.Table.from_batches(sink.batches, schema=schema)
        result = _assemble(arrow, out, by_position=self._id_column is None)
        if kind == "polars":
            import polars as pl

            return pl.from_arrow(result)
        if kind == "pandas":
            return result.to_pandas()
        return result


def generate(
    table: Any,
    *,
    model: str | None = None,
    sampling: SamplingParams | Mapping[str, Any] | None = None,
    prompt_column: str = "prompt",
    messages_column: str | None = None,
    prompt_token_ids_column: str | None = None,
    sampling_params_column: str | None = None,
    id_column: str | None = None,
    seed: int = 0,
    prompt_too_long: str = "error",
    order: str = "prefix",
    window_rows: int = 1024,
    max_error_rate: float = 1.0,
    include_token_ids: bool = False,
    include_logprobs: bool = False,
    use_tqdm: bool = True,
    chat: ChatOptions | Mapping[str, Any] | None = None,
    **engine_options: Any,
) -> Any:
    """Generate for every row of `table` (a pyarrow.Table, polars.DataFrame or
    pandas.DataFrame, converted by pyarrow; its index is not kept). The prompt is
    `prompt_column` (text), `messages_column` (chats) or `prompt_token_ids_column` (lists of
    token ids). `chat` says how chats render, as a job file's `chat:` section does: a mapping
    with `template` (a Jinja string replacing the tokenizer's), `template_kwargs` (extra template
    variables, e.g. ``{"enable_thinking": False}``), `add_generation_prompt` and
    `continue_final_message`, or a `ChatOptions`.

    Returns the same kind of table: the input columns, then `sample_index`, `output`,
    `finish_reason`, `stop_reason`, `usage`, `error`, `seed` (and `output_token_ids`,
    `logprobs` when asked). Bad rows get an `error` instead of failing the call. Each row's
    seed derives from `seed` and the row's value in `id_column` (as in a job, where a duplicate
    id is an error row), or its position in the table when `id_column` is None. Unknown keyword
    arguments raise TypeError; bad values raise ValueError (a `sampling.structured_outputs`
    that the grammar engine rejects included; a per-row one is a `bad_structured_output` row).
    """
    generator = TableGenerator(
        model=model,
        sampling=sampling,
        prompt_column=prompt_column,
        messages_column=messages_column,
        prompt_token_ids_column=prompt_token_ids_column,
        sampling_params_column=sampling_params_column,
        id_column=id_column,
        seed=seed,
        prompt_too_long=prompt_too_long,
        order=order,
        window_rows=window_rows,
        max_error_rate=max_error_rate,
        include_token_ids=include_token_ids,
        include_logprobs=include_logprobs,
        use_tqdm=use_tqdm,
        chat=chat,
        **engine_options,
    )
    return generator(table)


def _check_sampling_struct(field: pa.Field, name: str) -> None:
    """Raises ValueError when the per-row sampling column is not a struct of SamplingParams
    fields (checked before any work, as `batchgen run` checks a shard's footer)."""
    if not pa.types.is_struct(field.type):
        raise ValueError(f"column {name!r} (sampling_params) has type {field.type}; expected a struct")
    known = {f.name for f in fields(SamplingParams)}
    for idx in range(field.type.num_fields):
        sub = field.type.field(idx).name
        if sub not in known:
            raise ValueError(
                f"column {name!r} (sampling_params) has a field {sub!r} that is not a sampling "
                f"parameter; expected some of: {', '.join(sorted(known))}"
            )


def _assemble(arrow: pa.Table, out: pa.Table, *, by_position: bool) -> pa.Table:
    """Input columns in their order (repeated per sample), then the output columns.

    Output rows come in input order, each input row's samples together starting at sample 0, so
    without position ids an input row's position counts the sample-0 rows before it."""
    if by_position:
        positions = out.column("id")
    else:
        starts = pc.equal(out.column("sample_index"), 0)
        positions = pc.subtract(pc.cumulative_sum(pc.cast(starts, pa.int64())), 1)
    result = arrow.take(positions)
    for name in out.column_names:
        if name == "id":
            continue
        if name in result.column_names:
            raise ValueError(f"the input table already has a column named {name!r}, an output column")
        result = result.append_column(name, out.column(name))
    return result
