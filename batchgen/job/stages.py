"""Types shared by the pipeline's stages and its callers: shard metadata, source and sink
protocols, options, statistics, the per-row result and the progress bar."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from tqdm.auto import tqdm

from batchgen.io import ColumnMap, InputIdentity, OutputRow
from batchgen.job.prepare import PreparedRow

__all__ = [
    "JobError",
    "PipelineOptions",
    "PipelineStats",
    "Progress",
    "RowResult",
    "ShardMeta",
    "ShardStats",
    "Sink",
    "Source",
]


class JobError(Exception):
    """A job-level failure with a message for the user (no traceback)."""


@dataclass(frozen=True, slots=True)
class ShardMeta:
    index: int
    name: str
    num_rows: int
    input_path: str
    id_type: pa.DataType
    passthrough: pa.Schema
    # The Hive partition values of the input shard (`batchgen.io.hive_partitions`).
    partitions: tuple[tuple[str, str], ...] = ()
    # The input's identity recorded at planning; a source checks it against the file it reads
    # (None: nothing to check, e.g. an in-memory table).
    identity: InputIdentity | None = None


class Source(Protocol):
    def iter_batches(self, shard: ShardMeta) -> Iterator[pa.RecordBatch]:
        """Blocking generator over the shard's record batches (required columns only)."""
        ...


@dataclass(slots=True)
class ShardStats:
    rows_by_status: Counter[str] = field(default_factory=Counter)
    error_codes: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    num_output_rows: int = 0
    started: float = field(default_factory=time.perf_counter)


class Sink(Protocol):
    def write(self, shard: ShardMeta, rows: Sequence[OutputRow]) -> None:
        """Append rows (in input order) to the shard's pending output. Blocking."""
        ...

    def commit(self, shard: ShardMeta, stats: ShardStats) -> None:
        """Make the shard's output final. Blocking."""
        ...

    def discard(self, shard: ShardMeta) -> None:
        """Drop the uncommitted output of one shard (its input turned out unreadable)."""
        ...

    def abort(self) -> None:
        """Drop every uncommitted output (nothing partial may remain)."""
        ...


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    columns: ColumnMap
    batch_rows: int
    order: str  # "prefix" | "input"
    window_rows: int
    max_error_rate: float
    min_rows_for_error_rate: int
    include_token_ids: bool
    include_logprobs: bool
    use_tqdm: bool = True
    on_bad_shard: str = "fail"  # "fail" | "skip": what an unreadable input shard does
    # Called after each batch of rows is written: (rows written, the engine's output tokens so
    # far, its prefix hit rate so far). A Ray worker reports its progress to the driver with it.
    on_progress: Callable[[int, int, float], None] | None = None
    # True: the engine loop waits for the next window of rows whenever it holds fewer than its
    # target, as if preparing rows cost no engine time (a simulation: its fast steps must not
    # outrun the prepare stage, or its batches would depend on thread timing). A run steps on.
    wait_for_rows: bool = False


@dataclass(slots=True)
class PipelineStats:
    """What a run did; engine counters are the difference over this run."""

    wall_s: float = 0.0
    num_rows: int = 0
    num_output_rows: int = 0
    rows_by_status: Counter[str] = field(default_factory=Counter)
    error_codes: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ideal_prefill_tokens: int = 0
    engine: dict[str, int] = field(default_factory=dict)
    committed_shards: list[str] = field(default_factory=list)
    # Shards skipped under on_bad_shard: skip, by name: the read error. Written by the read
    # stage, read by the write stage (both on the event loop).
    bad_shards: dict[str, str] = field(default_factory=dict)
    # Output rows under structured_outputs: constrained, completed, cut_by_length
    # (`batchgen.job.structured_rows`). Written by the engine stage.
    structured_outputs: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class RowResult:
    row: PreparedRow
    outputs: list[OutputRow]


class Progress:
    def __init__(
        self, total: int, enabled: bool, listener: Callable[[int, int, float], None] | None = None
    ) -> None:
        self._bar = tqdm(total=total, desc="rows", unit="row", disable=not enabled, dynamic_ncols=True)
        self._listener = listener
        self._start = time.perf_counter()
        self._out_tokens = 0
        self._hit = 0.0

    def engine(self, output_tokens: int, hit_rate: float) -> None:
        self._out_tokens = output_tokens
        self._hit = hit_rate

    def rows(self, n: int) -> None:
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._bar.set_postfix_str(f"out {self._out_tokens / elapsed:.1f} tok/s, hit {self._hit:.0%}", refresh=False)
        self._bar.update(n)
        if self._listener is not None:
            self._listener(n, self._out_tokens, self._hit)

    def close(self) -> None:
        self._bar.close()
