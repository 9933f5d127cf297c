"""`batchgen.generate(table, ...)`: the job pipeline over an in-memory Arrow table (or polars, or pandas).

The table goes through the same prepare / order / engine / write stages as `batchgen run`, as one
shard; the result is the input table with the output columns appended, rows in input order
(`n` > 1 repeats each row once per sample). polars is imported only when a polars frame comes in; a pandas frame comes back as pandas.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields
from typing import Any

import pyarrow as pa

from batchgen.engine.config import engine_configs
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.io import ColumnMap, OutputRow, output_schema, rows_to_batch
from batchgen.job.pipeline import run_pipeline_sync
from batchgen.job.prepare import RowPreparer
from batchgen.job.stages import PipelineOptions, ShardMeta, ShardStats
from batchgen.models.checkpoint import load_checkpoint

__all__ = ["generate"]

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

    def abort(self) -> None:
        self.batches.clear()


def generate(
    table: Any,
    *,
    model: str | None = None,
    sampling: SamplingParams | Mapping[str, Any] | None = None,
    prompt_column: str = "prompt",
    messages_column: str | None = None,
    prompt_token_ids_column: str | None = None,
    sampling_params_column: str | None = None,
    seed: int = 0,
    prompt_too_long: str = "error",
    order: str = "prefix",
    window_rows: int = 1024,
    max_error_rate: float = 1.0,
    include_token_ids: bool = False,
    include_logprobs: bool = False,
    use_tqdm: bool = True,
    **engine_options: Any,
) -> Any:
    """Generate for every row of `table` (a pyarrow.Table, polars.DataFrame or
    pandas.DataFrame, converted by pyarrow; its index is not kept). The prompt is
    `prompt_column` (text), `messages_column` (chats) or `prompt_token_ids_column` (lists of
    token ids).

    Returns the same kind of table: the input columns, then `sample_index`, `output`,
    `finish_reason`, `stop_reason`, `usage`, `error`, `seed` (and `output_token_ids`,
    `logprobs` when asked). Bad rows get an `error` instead of failing the call. Unknown
    keyword arguments raise TypeError; bad values raise ValueError.
    """
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
    if messages_column is not None or prompt_token_ids_column is not None:
        prompt_column_used: str | None = None
    else:
        prompt_column_used = prompt_column
    needed = [
        c
        for c in (prompt_column_used, messages_column, prompt_token_ids_column, sampling_params_column)
        if c
    ]
    missing = [c for c in needed if c not in arrow.column_names]
    if missing:
        raise ValueError(f"the table has no column {missing[0]!r}; its columns: {', '.join(arrow.column_names)}")
    if sampling_params_column is not None:
        _check_sampling_struct(arrow.schema.field(sampling_params_column), sampling_params_column)
    engine_config = engine_configs(engine_options)
    if order not in ("prefix", "input"):
        raise ValueError(f"order must be 'prefix' or 'input', got {order!r}")
    if prompt_too_long not in ("error", "truncate_left", "truncate_right"):
        raise ValueError(f"prompt_too_long must be error, truncate_left or truncate_right, got {prompt_too_long!r}")

    params = sampling if isinstance(sampling, SamplingParams) else SamplingParams.from_mapping(sampling or {})
    # Rows are keyed by position; the input columns are put back from the input table at the end,
    # so none of them needs to travel through the pipeline.
    work = pa.table({_ROW_ID: pa.array(range(arrow.num_rows), pa.int64())})
    for name in needed:
        work = work.append_column(name, arrow.column(name))
    columns = ColumnMap(
        id=_ROW_ID,
        prompt=prompt_column_used,
        messages=messages_column,
        prompt_token_ids=prompt_token_ids_column,
        sampling_params=sampling_params_column,
    )

    checkpoint = load_checkpoint(model)
    engine = LLMEngine.from_configs(checkpoint, engine_config, seed=seed)
    preparer = RowPreparer(
        checkpoint.tokenizer,
        params,
        max_model_len=engine.max_model_len,
        prompt_too_long=prompt_too_long,  # type: ignore[arg-type]
        job_seed=seed,
    )
    passthrough_schema = pa.schema([])
    schema = output_schema(pa.int64(), passthrough_schema, with_token_ids=include_token_ids, with_logprobs=include_logprobs)
    shard = ShardMeta(
        index=0, name="table", num_rows=arrow.num_rows, input_path="<table>", id_type=pa.int64(), passthrough=passthrough_schema
    )
    sink = _TableSink(schema)
    options = PipelineOptions(
        columns=columns,
        batch_rows=1024,
        order=order,
        window_rows=window_rows,
        max_error_rate=max_error_rate,
        min_rows_for_error_rate=100,
        include_token_ids=include_token_ids,
        include_logprobs=include_logprobs,
        use_tqdm=use_tqdm,
    )
    run_pipeline_sync(engine, preparer, _TableSource(work, 1024), sink, [shard], options)
    out = pa.Table.from_batches(sink.batches, schema=schema)
    result = _assemble(arrow, out)
    if kind == "polars":
        import polars as pl

        return pl.from_arrow(result)
    if kind == "pandas":
        return result.to_pandas()
    return result


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


def _assemble(arrow: pa.Table, out: pa.Table) -> pa.Table:
    """Input columns in their order (repeated per sample), then the output columns."""
    row_ids = out.column("id")
    result = arrow.take(row_ids)
    for name in out.column_names:
        if name == "id":
            continue
        if name in result.column_names:
            raise ValueError(f"the input table already has a column named {name!r}, an output column")
        result = result.append_column(name, out.column(name))
    return result
