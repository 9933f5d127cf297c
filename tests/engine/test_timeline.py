"""The engine timeline: bounded rows, exact totals, merged intervals, the engine's own counters."""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

import pytest

from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.timeline import Timeline, TimelineRow
from batchgen.models.checkpoint import load_checkpoint
from tests.tiny_models import make_tiny_hf_folder


def _step(timeline: Timeline, i: int, totals: dict[str, int]) -> None:
    totals["prefill"] += i % 3
    totals["cached"] += i % 2
    totals["preempt"] += 1 if i % 97 == 0 else 0
    timeline.record_step(
        t_start=1000.0 + i,
        t_end=1000.5 + i,
        num_scheduled_tokens=(i % 3) + 1,
        num_output_tokens=1,
        num_finished=1 if i % 10 == 0 else 0,
        num_running=i % 5,
        num_waiting=2,
        prefill_tokens_total=totals["prefill"],
        cached_tokens_total=totals["cached"],
        preemptions_total=totals["preempt"],
        kv_blocks_used=i % 7,
        kv_blocks_cached=3,
        kv_blocks_free=10 - i % 7,
    )


def test_a_long_run_of_tiny_steps_keeps_a_bounded_number_of_rows() -> None:
    timeline = Timeline(max_rows=16, kv_blocks_total=10)
    totals = {"prefill": 0, "cached": 0, "preempt": 0}
    num_steps = 100_000
    max_seen = 0
    for i in range(num_steps):
        _step(timeline, i, totals)
        if i % 1000 == 0:
            max_seen = max(max_seen, len(timeline.rows()))
    rows = timeline.rows()
    assert max_seen <= 17 and len(rows) <= 17  # max_rows closed rows plus the open one
    assert len(rows) >= 8
    assert sum(r.num_steps for r in rows) == num_steps
    assert sum(r.output_tokens for r in rows) == num_steps
    assert sum(r.prefill_tokens for r in rows) == totals["prefill"]
    assert sum(r.decode_tokens for r in rows) == sum((i % 3) + 1 for i in range(num_steps)) - totals["prefill"]
    assert sum(r.cached_tokens for r in rows) == totals["cached"]
    assert sum(r.preemptions for r in rows) == totals["preempt"]
    assert sum(r.finished_requests for r in rows) == num_steps // 10
    # Equal-width closed rows in time order, covering every step.
    width = timeline.steps_per_row
    assert width & (width - 1) == 0 and width >= num_steps // 16
    assert all(r.num_steps == width for r in rows[:-1])
    assert rows[0].t_start == 1000.0 and rows[-1].t_end == 1000.5 + num_steps - 1
    assert all(a.t_end < b.t_start for a, b in itertools.pairwise(rows))
    # Gauges are exact means over the steps of each row, and the max survives merging.
    first = range(width)
    assert rows[0].seqs_running == pytest.approx(sum(i % 5 for i in first) / width)
    assert rows[0].kv_blocks_used_max == 6
    assert rows[0].step_s == pytest.approx(0.5 * width)
    assert {r.kv_blocks_total for r in rows} == {10}


def test_rows_without_steps_and_bad_sizes() -> None:
    timeline = Timeline(max_rows=4)
    assert timeline.rows() == []
    timeline.record_rows(now=5.0, num_ok=0, num_error=3)
    timeline.record_rows(now=6.0, num_ok=2, num_error=1)
    (row,) = timeline.rows()
    assert (row.t_start, row.t_end, row.num_steps, row.ok_rows, row.error_rows) == (5.0, 6.0, 0, 2, 4)
    assert row.seqs_running == 0.0 and row.kv_blocks_used == 0.0
    assert set(TimelineRow.field_names()) >= {"t_start", "ok_rows", "kv_blocks_free"}
    for bad in (0, 1, 3, True):
        with pytest.raises(ValueError, match="max_rows"):
            Timeline(max_rows=bad)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _engine(folder: Path, **cache: int) -> LLMEngine:
    return LLMEngine(
        load_checkpoint(str(folder)),
        # admission_reserve_tokens 0: admit greedily, so a small pool preempts
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, admission_reserve_tokens=0),
        cache_config=CacheConfig(block_size=4, **cache),
        runner_config=RunnerConfig(device="cpu", max_model_len=64),
        timeline_max_rows=8,
    )


def _run(engine: LLMEngine) -> None:
    rng = random.Random(3)
    shared = [rng.randrange(1000, 20000) for _ in range(13)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i in range(8):
        engine.add_request(shared + [rng.randrange(1000, 20000) for _ in range(i + 1)], params)
    while engine.has_unfinished():
        engine.step()


def test_engine_timeline_totals_equal_its_counters_with_preemptions(folder: Path) -> None:
    # 16 blocks of 4 tokens for 8 sequences of up to 45 tokens: preemption by recompute.
    engine = _engine(folder, num_kv_blocks=16)
    _run(engine)
    stats = engine.stats()
    rows = engine.timeline.rows()
    assert stats.num_preemptions > 0
    assert len(rows) <= 9 and engine.timeline.steps_per_row > 1
    assert sum(r.num_steps for r in rows) == stats.num_steps
    assert sum(r.preemptions for r in rows) == stats.num_preemptions
    assert sum(r.prefill_tokens for r in rows) == stats.prefill_tokens_computed
    assert sum(r.cached_tokens for r in rows) == stats.cached_prompt_tokens
    assert sum(r.output_tokens for r in rows) == stats.generation_tokens == 8 * 24
    assert sum(r.finished_requests for r in rows) == 8
    assert max(r.kv_blocks_used_max for r in rows) == stats.peak_kv_blocks_used <= 16
    assert all(r.kv_blocks_total == 16 for r in rows)
    assert all(0 <= r.kv_blocks_used <= 16 and r.seqs_running <= 8 for r in rows)
    assert rows[0].t_start <= rows[-1].t_end <= time.time()

