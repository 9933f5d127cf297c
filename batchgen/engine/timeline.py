"""The engine's timeline: what each stretch of steps did, in a bounded number of rows.

Owns the rows of one engine's timeline. `LLMEngine.step` records each step (a few additions);
the job adds the rows it emits (finished and error rows) and reads `rows()` to save them.

Bounded: steps accumulate into intervals of `steps_per_row` steps. When `max_rows` closed rows
exist, adjacent pairs merge and `steps_per_row` doubles, so a run of any length keeps between
`max_rows / 2` and `max_rows` rows (plus the open one) of equal step width:

    rows:  | 1 | 2 | 3 | 4 |      full (max_rows = 4)
    merge: | 1+2 | 3+4 |          two rows of twice the width; the open row then fills to it

Counters add when rows merge; gauges (running and waiting sequences, KV blocks) are kept as sums
over steps, so their mean stays exact; `kv_blocks_used_max` keeps the maximum.

Thread-safety: one lock, taken once per `record_step`, `record_rows` and `rows` call, so the
job may read rows from another thread while the engine steps.

May import: the standard library only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

from batchgen._checks import check_int

__all__ = ["Timeline", "TimelineRow"]


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """One interval of a run. Times are Unix seconds (the engine's clock: `time.time()` unless
    a simulation's); gauges are means over the
    interval's steps (0 for an interval without steps); token counts are per interval.

    seqs_running: sequences in a step's batch; seqs_waiting: queued after its scheduling;
    prefill_tokens: prompt tokens computed (not served by the prefix cache);
    decode_tokens: the other scheduled tokens (decodes, and outputs recomputed after a preemption);
    cached_tokens: prompt tokens served by the prefix cache at admission;
    output_tokens: tokens sampled; finished_requests: requests the engine finished;
    ok_rows / error_rows: rows the job emitted, by status (error rows may skip the engine);
    context_tokens: KV tokens the steps' attention read (per chunk, its start position plus its
    tokens); attention_pairs: (query, key) pairs attention computed (a chunk of q tokens after s
    computed ones: q*s + q*(q+1)/2). The last two are the cost model's work counts (batchgen.sim);
    0 in rows written before they existed.
    """

    t_start: float
    t_end: float
    num_steps: int
    step_s: float
    seqs_running: float
    seqs_waiting: float
    prefill_tokens: int
    decode_tokens: int
    cached_tokens: int
    output_tokens: int
    kv_blocks_used: float
    kv_blocks_used_max: int
    kv_blocks_cached: float
    kv_blocks_free: float
    kv_blocks_total: int
    preemptions: int
    finished_requests: int
    ok_rows: int
    error_rows: int
    context_tokens: int = 0
    attention_pairs: int = 0

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass(slots=True)
class _Interval:
    t_start: float
    t_end: float
    num_steps: int = 0
    step_s: float = 0.0
    running_sum: int = 0
    waiting_sum: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    used_sum: int = 0
    used_max: int = 0
    cached_sum: int = 0
    free_sum: int = 0
    preemptions: int = 0
    finished_requests: int = 0
    ok_rows: int = 0
    error_rows: int = 0
    context_tokens: int = 0
    attention_pairs: int = 0

    def merge(self, other: _Interval) -> None:
        """Add `other` (the later interval) into this one."""
        self.t_start = min(self.t_start, other.t_start)
        self.t_end = max(self.t_end, other.t_end)
        self.num_steps += other.num_steps
        self.step_s += other.step_s
        self.running_sum += other.running_sum
        self.waiting_sum += other.waiting_sum
        self.prefill_tokens += other.prefill_tokens
        self.decode_tokens += other.decode_tokens
        self.cached_tokens += other.cached_tokens
        self.output_tokens += other.output_tokens
        self.used_sum += other.used_sum
        self.used_max = max(self.used_max, other.used_max)
        self.cached_sum += other.cached_sum
        self.free_sum += other.free_sum
        self.preemptions += other.preemptions
        self.finished_requests += other.finished_requests
        self.ok_rows += other.ok_rows
        self.error_rows += other.error_rows
        self.context_tokens += other.context_tokens
        self.attention_pairs += other.attention_pairs

    def row(self, kv_blocks_total: int) -> TimelineRow:
        n = max(1, self.num_steps)
        return TimelineRow(
            t_start=self.t_start,
            t_end=self.t_end,
            num_steps=self.num_steps,
            step_s=self.step_s,
            seqs_running=self.running_sum / n,
            seqs_waiting=self.waiting_sum / n,
            prefill_tokens=self.prefill_tokens,
            decode_tokens=self.decode_tokens,
            cached_tokens=self.cached_tokens,
            output_tokens=self.output_tokens,
            kv_blocks_used=self.used_sum / n,
            kv_blocks_used_max=self.used_max,
            kv_blocks_cached=self.cached_sum / n,
            kv_blocks_free=self.free_sum / n,
            kv_blocks_total=kv_blocks_total,
            preemptions=self.preemptions,
            finished_requests=self.finished_requests,
            ok_rows=self.ok_rows,
            error_rows=self.error_rows,
            context_tokens=self.context_tokens,
            attention_pairs=self.attention_pairs,
        )


class Timeline:
    """A bounded, always-on record of an engine's steps (see the module docstring)."""

    def __init__(self, max_rows: int = 1024, *, kv_blocks_total: int = 0) -> None:
        """max_rows: the most closed rows kept (even, >= 2). Raises ValueError otherwise."""
        check_int("timeline max_rows", max_rows, minimum=2)
        if max_rows % 2:
            raise ValueError(f"timeline max_rows must be even, got {max_rows}")
        self._max_rows = max_rows
        self._kv_blocks_total = kv_blocks_total
        self._closed: list[_Interval] = []
        self._open: _Interval | None = None
        self._steps_per_row = 1
        # Cumulative engine counters at the previous step, to turn them into per-step deltas.
        self._last_prefill = 0
        self._last_cached = 0
        self._last_preemptions = 0
        self._lock = threading.Lock()

    @property
    def max_rows(self) -> int:
        return self._max_rows

    @property
    def steps_per_row(self) -> int:
        """Steps each closed row holds now (doubles at every merge)."""
        return self._steps_per_row

    def record_step(
        self,
        *,
        t_start: float,
        t_end: float,
        num_scheduled_tokens: int,
        num_output_tokens: int,
        num_finished: int,
        num_running: int,
        num_waiting: int,
        prefill_tokens_total: int,
        cached_tokens_total: int,
        preemptions_total: int,
        kv_blocks_used: int,
        kv_blocks_cached: int,
        kv_blocks_free: int,
        num_context_tokens: int = 0,
        num_attention_pairs: int = 0,
    ) -> None:
        """Add one engine step. The `*_total` arguments are the engine's cumulative counters;
        times are seconds on the engine's clock (Unix seconds unless a simulation's)."""
        with self._lock:
            prefill = prefill_tokens_total - self._last_prefill
            cached = cached_tokens_total - self._last_cached
            preemptions = preemptions_total - self._last_preemptions
            self._last_prefill = prefill_tokens_total
            self._last_cached = cached_tokens_total
            self._last_preemptions = preemptions_total
            interval = self._open
            if interval is None:
                interval = self._open = _Interval(t_start, t_end)
            interval.t_end = t_end
            interval.num_steps += 1
            interval.step_s += t_end - t_start
            interval.running_sum += num_running
            interval.waiting_sum += num_waiting
            interval.prefill_tokens += prefill
            interval.decode_tokens += num_scheduled_tokens - prefill
            interval.cached_tokens += cached
            interval.output_tokens += num_output_tokens
            interval.used_sum += kv_blocks_used
            interval.used_max = max(interval.used_max, kv_blocks_used)
            interval.cached_sum += kv_blocks_cached
            interval.free_sum += kv_blocks_free
            interval.preemptions += preemptions
            interval.finished_requests += num_finished
            interval.context_tokens += num_context_tokens
            interval.attention_pairs += num_attention_pairs
            if interval.num_steps >= self._steps_per_row:
                self._close()

    def record_rows(self, *, now: float, num_ok: int, num_error: int) -> None:
        """Add rows the job emitted at Unix time `now` (into the open interval)."""
        with self._lock:
            interval = self._open
            if interval is None:
                interval = self._open = _Interval(now, now)
            interval.t_end = max(interval.t_end, now)
            interval.ok_rows += num_ok
            interval.error_rows += num_error

    def rows(self) -> list[TimelineRow]:
        """A snapshot: the closed rows, then the open one if it holds anything."""
        with self._lock:
            intervals = [*self._closed, *([self._open] if self._open is not None else [])]
            return [i.row(self._kv_blocks_total) for i in intervals]

    def _close(self) -> None:
        assert self._open is not None
        self._closed.append(self._open)
        self._open = None
        if len(self._closed) >= self._max_rows:
            merged = []
            for first, second in zip(self._closed[::2], self._closed[1::2], strict=True):
                first.merge(second)
                merged.append(first)
            self._closed = merged
            self._steps_per_row *= 2
