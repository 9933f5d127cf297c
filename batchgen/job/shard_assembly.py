"""The write stage: reassemble each shard's rows in input order and commit it at its last row.

Rows arrive out of order (prefix ordering, different generation lengths); each shard keeps the
rows that cannot be written yet, writes contiguous runs in batches of `batch_rows`, and commits
when its last row is written. Also counts rows and tokens and enforces `max_error_rate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import ObjectReceiveStream

from batchgen.io import OutputRow
from batchgen.job.stages import (
    JobError,
    PipelineOptions,
    PipelineStats,
    Progress,
    RowResult,
    ShardMeta,
    ShardStats,
    Sink,
)

__all__ = ["achieved_hit_rate", "ideal_hit_rate", "write_stage"]


@dataclass(slots=True)
class _ShardState:
    next_row: int = 0
    pending: dict[int, list[OutputRow]] = field(default_factory=dict)
    ready: list[OutputRow] = field(default_factory=list)
    stats: ShardStats = field(default_factory=ShardStats)


async def write_stage(
    sink: Sink,
    shards: Sequence[ShardMeta],
    options: PipelineOptions,
    stats: PipelineStats,
    progress: Progress,
    recv: ObjectReceiveStream[list[RowResult]],
) -> None:
    """Reassemble each shard in input order, write it in batches, commit it at its last row."""
    by_index = {s.index: s for s in shards}
    states = {s.index: _ShardState() for s in shards}

    async def drain(shard: ShardMeta, state: _ShardState, final: bool) -> None:
        while state.next_row in state.pending:
            state.ready.extend(state.pending.pop(state.next_row))
            state.next_row += 1
        if state.ready and (final or len(state.ready) >= options.batch_rows):
            rows, state.ready = state.ready, []
            await anyio.to_thread.run_sync(sink.write, shard, rows)
        if state.next_row == shard.num_rows and not state.pending and not state.ready:
            await anyio.to_thread.run_sync(sink.commit, shard, state.stats)
            stats.committed_shards.append(shard.name)
            del states[shard.index]

    async def drop_bad_shards() -> None:
        # A shard whose input failed to read (on_bad_shard: skip) never completes: drop what
        # it has written; rows of it still in flight are ignored when they arrive.
        for index in [i for i in states if by_index[i].name in stats.bad_shards]:
            del states[index]
            await anyio.to_thread.run_sync(sink.discard, by_index[index])

    for shard in shards:
        if shard.num_rows == 0:
            await drain(shard, states[shard.index], final=True)
    async with recv:
        async for results in recv:
            await drop_bad_shards()
            touched: set[int] = set()
            for result in results:
                row = result.row
                if row.shard not in states and by_index[row.shard].name in stats.bad_shards:
                    continue  # its shard was dropped as unreadable
                state = states[row.shard]
                state.pending[row.row_idx] = result.outputs
                _count(state.stats, stats, result)
                touched.add(row.shard)
            progress.rows(len(results))
            _check_error_rate(stats, options)
            for index in touched:
                shard = by_index[index]
                state = states[index]
                await drain(shard, state, final=state.next_row + len(state.pending) == shard.num_rows)
    await drop_bad_shards()
    if states:
        missing = ", ".join(by_index[i].name for i in states)
        raise JobError(f"the pipeline ended before these shards were complete: {missing}")


def _count(shard_stats: ShardStats, stats: PipelineStats, result: RowResult) -> None:
    is_error = result.row.error is not None or any(o.finish_reason == "error" for o in result.outputs)
    status = "error" if is_error else "ok"
    shard_stats.rows_by_status[status] += 1
    stats.rows_by_status[status] += 1
    if is_error:
        code = result.outputs[0].error_code if result.outputs else "internal"
        shard_stats.error_codes[code or "internal"] += 1
        stats.error_codes[code or "internal"] += 1
    else:
        first = result.outputs[0]
        shard_stats.prompt_tokens += first.prompt_tokens
        shard_stats.cached_tokens += first.cached_tokens
        stats.prompt_tokens += first.prompt_tokens
        stats.cached_tokens += first.cached_tokens
    completion = sum(o.completion_tokens for o in result.outputs)
    shard_stats.completion_tokens += completion
    stats.output_tokens += completion
    shard_stats.num_output_rows += len(result.outputs)
    stats.num_output_rows += len(result.outputs)


def _check_error_rate(stats: PipelineStats, options: PipelineOptions) -> None:
    done = sum(stats.rows_by_status.values())
    errors = stats.rows_by_status["error"]
    if done >= options.min_rows_for_error_rate and errors / done > options.max_error_rate:
        top = ", ".join(f"{code} x{n}" for code, n in stats.error_codes.most_common(3))
        raise JobError(
            f"stopping early: {errors} of the first {done} rows failed "
            f"({errors / done:.0%} > max_error_rate {options.max_error_rate:.0%}); most common: {top}"
        )


def ideal_hit_rate(stats: PipelineStats) -> float:
    """Share of prompt tokens a perfect prefix cache could skip (within each ordering window)."""
    if stats.prompt_tokens == 0:
        return 0.0
    return max(0.0, 1.0 - stats.ideal_prefill_tokens / stats.prompt_tokens)


def achieved_hit_rate(stats: PipelineStats) -> float:
    return stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
