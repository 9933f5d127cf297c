"""The streaming pipeline: read -> prepare -> order -> engine -> write, in one anyio task group.

Stages are connected by bounded memory object streams, so memory stays bounded whatever the
dataset size, and a failing stage cancels the others. Blocking work (Parquet I/O, tokenizing) runs
in anyio's worker threads; the engine loop task owns the engine and runs every step on one
dedicated thread (`batchgen.engine.step_thread`: on the CPU, steps taken from several threads
keep several OpenMP thread pools, and libgomp throttles them all).

The source says which shards exist and streams their record batches; the sink receives each
shard's output rows in input order and commits the shard once its last row is written. Files
(`batchgen run`) and in-memory tables (`batchgen.generate`) are two sources and sinks of the same
pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from anyio.streams.memory import MemoryObjectReceiveStream

from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.outputs import RequestOutput
from batchgen.engine.seeding import derive_seed
from batchgen.engine.step_thread import StepThread
from batchgen.io import OutputRow, ShardReadError
from batchgen.job.prepare import PreparedRow, RowError, RowPreparer
from batchgen.job.prepare_stage import PrepareItem, ProcessPreparer, prepare_batch
from batchgen.job.score_output import echo_prompt, score_output_row
from batchgen.job.shard_assembly import write_stage
from batchgen.job.stages import (
    PipelineOptions,
    PipelineStats,
    Progress,
    RowResult,
    ShardMeta,
    Sink,
    Source,
)
from batchgen.job.structured_rows import count_structured, request_error
from batchgen.radix import prefix_order, trie_token_count

__all__ = ["run_pipeline", "run_pipeline_sync"]

_STREAM_BUFFER = 4

# Python's collector looks at the young objects every 700 container allocations; an engine step
# allocates thousands that live for the step, so most collections find nothing to free and move
# the survivors on to older generations, which later full collections walk again (15% of a
# simulation's time). While a pipeline runs it looks every 50,000.
_YOUNG_COLLECTION_THRESHOLD = 50_000
_gc_lock = threading.Lock()
_gc_users = 0
_gc_saved: tuple[int, int, int] = (700, 10, 10)
_gc_froze = False


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Raise the young generation's threshold and freeze the objects alive now (the model, the
    tokenizer) out of full collections, until the last pipeline running in this process ends.
    A process that froze objects itself keeps them frozen and nothing more is frozen (unfreezing
    cannot tell its objects from ours)."""
    global _gc_users, _gc_saved, _gc_froze
    with _gc_lock:
        _gc_users += 1
        if _gc_users == 1:
            _gc_saved = gc.get_threshold()
            _gc_froze = gc.get_freeze_count() == 0
            if _gc_froze:
                gc.freeze()
            gc.set_threshold(max(_gc_saved[0], _YOUNG_COLLECTION_THRESHOLD), _gc_saved[1], _gc_saved[2])
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0:
                gc.set_threshold(*_gc_saved)
                if _gc_froze:
                    gc.unfreeze()


def _error_outputs(row: PreparedRow, error: RowError) -> list[OutputRow]:
    return [
        OutputRow(
            id=row.id,
            sample_index=i,
            passthrough=row.passthrough,
            output=None,
            finish_reason="error",
            stop_reason=None,
            prompt_tokens=len(row.token_ids or ()),
            completion_tokens=0,
            cached_tokens=0,
            error_code=error.code,
            error_message=error.message,
            seed=derive_seed(row.seed, i),
        )
        for i in range(row.num_samples)
    ]


def _success_outputs(row: PreparedRow, out: RequestOutput, options: PipelineOptions) -> list[OutputRow]:
    if row.score_from is not None:
        return [score_output_row(row, out, include_token_ids=options.include_token_ids)]
    echo = echo_prompt(row, out)
    rows = []
    for c in out.outputs:
        logprobs = None
        top: tuple[tuple[tuple[int, float], ...], ...] | None = None
        if options.include_logprobs and c.logprobs is not None:
            logprobs = tuple(entry[t] for t, entry in zip(c.token_ids, c.logprobs, strict=True))
            k = row.params.logprobs if row.params is not None else None
            if k:
                top = tuple(tuple(sorted(e.items(), key=lambda kv: -kv[1])[:k]) for e in c.logprobs)
        rows.append(
            OutputRow(
                id=row.id,
                sample_index=c.index,
                passthrough=row.passthrough,
                output=c.text,
                finish_reason=c.finish_reason,
                stop_reason=None if c.stop_reason is None else str(c.stop_reason),
                prompt_tokens=len(out.prompt_token_ids),
                completion_tokens=len(c.token_ids),
                cached_tokens=out.num_cached_tokens,
                error_code=None,
                error_message=None,
                seed=c.seed,
                output_token_ids=c.token_ids if options.include_token_ids else None,
                logprobs=logprobs,
                top_logprobs=top,
                echo=echo,
            )
        )
    return rows


async def run_pipeline(
    engine: LLMEngine,
    preparer: RowPreparer,
    source: Source,
    sink: Sink,
    shards: Sequence[ShardMeta],
    options: PipelineOptions,
    remote: ProcessPreparer | None = None,
) -> PipelineStats:
    """Run every shard through the engine into the sink. Raises JobError (error rate), and
    re-raises a stage's exception after cancelling the others; the sink is aborted on failure.
    With `remote`, rows are prepared by that preparer in its child process
    (`batchgen.job.prepare_stage`); `preparer` is then not used."""
    stats = PipelineStats(num_rows=sum(s.num_rows for s in shards))
    engine_before = engine.stats().as_dict()
    progress = Progress(stats.num_rows, options.use_tqdm, options.on_progress)
    start = time.perf_counter()
    send_batches, recv_batches = anyio.create_memory_object_stream[PrepareItem](_STREAM_BUFFER)
    send_rows, recv_rows = anyio.create_memory_object_stream[list[PreparedRow]](_STREAM_BUFFER)
    send_windows, recv_windows = anyio.create_memory_object_stream[list[PreparedRow]](_STREAM_BUFFER)
    send_results, recv_results = anyio.create_memory_object_stream[list[RowResult]](_STREAM_BUFFER)
    committed = False
    try:
        with _fewer_collections(), StepThread() as engine_thread:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_read, source, shards, options, stats, send_batches)
                if remote is None:
                    tg.start_soon(_prepare, preparer, options, recv_batches, send_rows)
                else:
                    tg.start_soon(_prepare_in_process, remote, recv_batches, send_rows)
                tg.start_soon(_order, options, stats, recv_rows, send_windows)
                tg.start_soon(
                    _engine_loop, engine, engine_thread, options, progress, recv_windows, send_results, stats
                )
                tg.start_soon(write_stage, sink, shards, options, stats, progress, recv_results)
        committed = True
    finally:
        progress.close()
        if not committed:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(sink.abort)
    stats.wall_s = time.perf_counter() - start
    after = engine.stats().as_dict()
    stats.engine = {k: after[k] - engine_before.get(k, 0) for k in after}
    stats.engine["num_kv_blocks"] = after["num_kv_blocks"]
    stats.engine["peak_kv_blocks_used"] = after["peak_kv_blocks_used"]
    return stats


async def _read(
    source: Source,
    shards: Sequence[ShardMeta],
    options: PipelineOptions,
    stats: PipelineStats,
    send: ObjectSendStream[PrepareItem],
) -> None:
    """Stream each shard's batches. An unreadable shard stops the job, or under
    ``on_bad_shard: skip`` goes into `stats.bad_shards` (the write stage then drops it)."""
    async with send:
        for shard in shards:
            try:
                await _read_shard(source, shard, send)
            except ShardReadError as exc:
                if options.on_bad_shard != "skip":
                    raise
                stats.bad_shards[shard.name] = str(exc)


async def _read_shard(source: Source, shard: ShardMeta, send: ObjectSendStream[PrepareItem]) -> None:
    it = source.iter_batches(shard)
    first = 0
    try:
        while True:
            batch = await anyio.to_thread.run_sync(next, it, None)
            if batch is None:
                break
            await send.send(PrepareItem(shard, first, batch))
            first += batch.num_rows
    finally:
        close: Callable[[], None] | None = getattr(it, "close", None)
        if close is not None:
            close()
    if first != shard.num_rows:
        raise ShardReadError(
            f"{shard.input_path}: read {first} rows, the file's footer says {shard.num_rows}"
        )


async def _prepare(
    preparer: RowPreparer,
    options: PipelineOptions,
    recv: ObjectReceiveStream[PrepareItem],
    send: ObjectSendStream[list[PreparedRow]],
) -> None:
    async with recv, send:
        async for item in recv:
            rows = await anyio.to_thread.run_sync(prepare_batch, preparer, options.columns, item)
            if item.ends_shard:
                preparer.forget_shard(item.shard.index)
            await send.send(rows)


async def _prepare_in_process(
    remote: ProcessPreparer,
    recv: ObjectReceiveStream[PrepareItem],
    send: ObjectSendStream[list[PreparedRow]],
) -> None:
    """The prepare stage in a child process: up to _STREAM_BUFFER batches queued there while the
    prepared ones are passed on, in order."""
    send_futures, recv_futures = anyio.create_memory_object_stream[Future[list[PreparedRow]]](_STREAM_BUFFER)

    async def submit() -> None:
        async with recv, send_futures:
            async for item in recv:
                await send_futures.send(remote.submit(item))

    async def collect() -> None:
        async with recv_futures, send:
            async for future in recv_futures:
                await send.send(await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True))

    async with anyio.create_task_group() as tg:
        tg.start_soon(submit)
        tg.start_soon(collect)


async def _order(
    options: PipelineOptions,
    stats: PipelineStats,
    recv: ObjectReceiveStream[list[PreparedRow]],
    send: ObjectSendStream[list[PreparedRow]],
) -> None:
    """Collect windows of window_rows prompts; emit each in depth-first order of its token trie."""

    async def flush(window: list[PreparedRow]) -> None:
        valid = [r.token_ids for r in window if r.token_ids is not None]
        stats.ideal_prefill_tokens += trie_token_count(valid)
        if options.order == "prefix":
            keys = [r.token_ids or () for r in window]
            window = [window[i] for i in prefix_order(keys)]
        await send.send(window)

    async with recv, send:
        window: list[PreparedRow] = []
        async for rows in recv:
            window.extend(rows)
            while len(window) >= options.window_rows:
                await flush(window[: options.window_rows])
                window = window[options.window_rows :]
        if window:
            await flush(window)


# Steps per hand-off to the engine thread when rows wait for finishes (a simulation); the loop
# gets control back at least this often, for the progress bar and the write stage.
_MAX_STEPS_PER_HANDOFF = 1024
# A simulation adds the next waiting rows on the engine thread as requests finish (True), rather
# than on the event loop after each hand-off; both make the same schedule.
_REFILL_ON_ENGINE_THREAD = True


def _add_row(engine: LLMEngine, row: PreparedRow, in_flight: dict[int, PreparedRow], results: list[RowResult]) -> None:
    """Add a prepared row's request to the engine, or its error outputs to `results`."""
    if row.error is not None or row.token_ids is None or row.params is None:
        results.append(RowResult(row, _error_outputs(row, row.error or RowError("internal", "no tokens"))))
        return
    try:
        request_id = engine.add_request(list(row.token_ids), row.params.with_seed(row.seed), score_from=row.score_from)
    except ValueError as exc:
        results.append(RowResult(row, _error_outputs(row, request_error(exc))))
        return
    in_flight[request_id] = row


def _finished_rows(
    engine: LLMEngine,
    finished: list[RequestOutput],
    in_flight: dict[int, PreparedRow],
    options: PipelineOptions,
    stats: PipelineStats,
) -> list[RowResult]:
    """The finished requests' rows, recorded in the timeline."""
    done = []
    for out in finished:
        row = in_flight.pop(out.request_id)
        count_structured(stats.structured_outputs, out)
        done.append(RowResult(row, _success_outputs(row, out, options)))
    engine.timeline.record_rows(now=engine.clock(), num_ok=len(done), num_error=0)
    return done


@dataclass(slots=True)
class _Feed:
    """The engine loop's rows: `in_flight` by request id, `pending` (next row last) not added yet,
    `exhausted` once the stream has ended."""

    in_flight: dict[int, PreparedRow]
    pending: list[PreparedRow]
    target: int
    exhausted: bool = False

    def refill(self, engine: LLMEngine, results: list[RowResult]) -> None:
        """Add pending rows while fewer than `target` are in flight (error rows go to `results`
        and the timeline)."""
        errors: list[RowResult] = []
        in_flight, pending, target = self.in_flight, self.pending, self.target
        while len(in_flight) < target and pending:
            _add_row(engine, pending.pop(), in_flight, errors)
        if errors:
            engine.timeline.record_rows(now=engine.clock(), num_ok=0, num_error=len(errors))
            results += errors


def _steps_with_refill(
    engine: LLMEngine, feed: _Feed, options: PipelineOptions, stats: PipelineStats, max_steps: int
) -> list[RowResult]:
    """Rows wait for finishes (a simulation): step, and after each step that finishes requests
    take in their rows and add pending ones up to the target, all on the engine thread. Returns
    after `max_steps` steps, when the engine runs dry, or when the pending rows run out before the
    target (the event loop fetches more). The event loop would have done the same between two
    hand-offs, so the schedule does not change; the hand-off per finish does."""
    results: list[RowResult] = []
    for _ in range(max_steps):
        finished = engine.step()
        if finished:
            results += _finished_rows(engine, finished, feed.in_flight, options, stats)
            if not _REFILL_ON_ENGINE_THREAD:
                break
            feed.refill(engine, results)
            if len(feed.in_flight) < feed.target and not feed.exhausted:
                break
        if not engine.has_unfinished():
            break
    return results


async def _engine_loop(
    engine: LLMEngine,
    engine_thread: StepThread,
    options: PipelineOptions,
    progress: Progress,
    recv: MemoryObjectReceiveStream[list[PreparedRow]],
    send: ObjectSendStream[list[RowResult]],
    stats: PipelineStats,
) -> None:
    """Feed the engine from the stream, step it on the engine thread, emit finished rows
    (counting the structured-output ones in `stats`)."""
    # Enough queued work for the scheduler to fill its budget; the rest waits in the stream.
    feed = _Feed({}, [], max(64, 2 * engine.max_num_seqs))
    in_flight = feed.in_flight
    if options.wait_for_rows:
        # Rows are added only when a request finishes (the queue is full, or no row is left), so
        # many steps run in one hand-off to the engine thread (a simulation's steps take
        # microseconds), adding the waiting rows there as requests finish.
        step: Callable[[], list[RowResult]] = functools.partial(
            _steps_with_refill, engine, feed, options, stats, _MAX_STEPS_PER_HANDOFF
        )
    else:
        step = functools.partial(_one_step, engine, feed, options, stats)
    async with recv, send:
        while True:
            results: list[RowResult] = []
            while len(in_flight) < feed.target and not feed.exhausted:
                if feed.pending:
                    feed.refill(engine, results)
                    continue
                try:
                    feed.pending = list(reversed(recv.receive_nowait()))
                except anyio.WouldBlock:
                    if in_flight and not options.wait_for_rows:
                        break
                    try:
                        feed.pending = list(reversed(await recv.receive()))
                    except anyio.EndOfStream:
                        feed.exhausted = True
                except anyio.EndOfStream:
                    feed.exhausted = True
            if results:
                await send.send(results)
            if not in_flight:
                if feed.exhausted and not feed.pending:
                    return
                continue
            # An anyio worker waits for the step, so the event loop stays free meanwhile.
            done = await anyio.to_thread.run_sync(engine_thread.submit(step).result)
            s = engine.stats()
            progress.engine(s.generation_tokens, s.cached_prompt_tokens / max(1, s.prompt_tokens))
            if done:
                await send.send(done)


def _one_step(engine: LLMEngine, feed: _Feed, options: PipelineOptions, stats: PipelineStats) -> list[RowResult]:
    """One step (a run: rows are added between steps as they come); the finished rows."""
    finished = engine.step()
    return _finished_rows(engine, finished, feed.in_flight, options, stats) if finished else []


def run_pipeline_sync(
    engine: LLMEngine,
    preparer: RowPreparer,
    source: Source,
    sink: Sink,
    shards: Sequence[ShardMeta],
    options: PipelineOptions,
    remote: ProcessPreparer | None = None,
) -> PipelineStats:
    """run_pipeline in a fresh event loop; a stage's failure comes out as itself, not wrapped."""
    try:
        return anyio.run(run_pipeline, engine, preparer, source, sink, shards, options, remote)
    except BaseExceptionGroup as group:
        raise _root_cause(group) from group


def _root_cause(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first failure that is not a cancellation or a closed stream (a symptom of it)."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for exc in leaves:
        if isinstance(exc, KeyboardInterrupt):
            return exc
    symptoms = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)
    for exc in leaves:
        if not isinstance(exc, symptoms) and not isinstance(exc, asyncio.CancelledError):
            return exc
    return leaves[0]
