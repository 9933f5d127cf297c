"""The simulator makes a real run's step sequence, step for step (the engine's own scheduler).

A small job runs for real (`run_job`, a tiny random model), then is simulated (`simulate_job`)
with the real run's outputs replayed. Both engines record every step's plan: each chunk's
sequence, positions, tokens, block table and samples, the KV block copies, and the cumulative
preemptions, cache hits and prefill tokens. The two sequences must be equal; the job is sized so
that they hold chunked prefills, prefix-cache hits, recompute preemptions and (n = 2) forks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.step_plan import StepPlan
from batchgen.job.config import JobConfig
from batchgen.job.config_file import job_config_from_dict
from batchgen.job.run import run_job
from batchgen.sim.engine import load_sim_model
from batchgen.sim.hardware import load_hardware
from batchgen.sim.job import simulate_job
from batchgen.sim.lengths import (
    Filler,
    MaxTokens,
    RecordedOutputs,
    TokenSource,
    read_recorded_outputs,
)
from tests.job.helpers import final_shards, make_prompt_shards
from tests.tiny_models import make_tiny_hf_folder

Step = tuple[Any, ...]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _config(tmp: Path, model: Path, *, sampling: dict[str, Any], engine: dict[str, Any] | None = None,
            num_shards: int = 2, rows_per_shard: int = 12, window_rows: int = 1024,
            bad_every: int = 0) -> JobConfig:
    for path in make_prompt_shards(tmp / "data", num_shards=num_shards, rows_per_shard=rows_per_shard):
        # each row its own max_tokens (3 to 14): samples end at different steps; with
        # `bad_every`, every so many rows ask for 0 tokens (an error row)
        table = pq.read_table(path)
        limits = [{"max_tokens": 0 if bad_every and row_id % bad_every == 3 else 3 + (row_id * 5) % 12}
                  for row_id in table.column("id").to_pylist()]
        pq.write_table(table.append_column("sp", pa.array(limits, pa.struct([("max_tokens", pa.int32())]))), path)
    data = {
        "model": str(model),
        "input": {"path": "data", "columns": {"id": "id", "prompt": "prompt", "sampling_params": "sp"},
                  "batch_rows": 5},
        "output": {"path": "out", "include_token_ids": True},
        "sampling": sampling,
        # A pool of 10 blocks for up to 6 sequences of 40-60 tokens: recompute preemptions; a
        # budget of 24 tokens: prompts in chunks; one window (the real feed is deterministic).
        "engine": {"max_num_seqs": 6, "max_num_batched_tokens": 24, "num_kv_blocks": 10,
                   "max_model_len": 128, "admission_reserve_tokens": 0, "device": "cpu", **(engine or {})},
        "window_rows": window_rows,
        "report": False,
    }
    return job_config_from_dict(data, source=tmp / "job.yaml", base_dir=tmp)


def _step(plan: StepPlan, engine: LLMEngine, *, with_tokens: bool) -> Step:
    stats = engine.scheduler.stats()
    chunks = tuple(
        (c.seq_id, c.start_pos, c.token_ids if with_tokens else len(c.token_ids), c.block_table,
         c.num_samples, c.sample_seeds, c.num_generated_tokens)
        for c in plan.chunks
    )
    return chunks, plan.block_copies, stats.num_preemptions, stats.cached_prompt_tokens, stats.prefill_tokens_computed


def _recording(steps: list[Step], *, with_tokens: bool) -> type[LLMEngine]:
    """An LLMEngine that appends each step's plan (and the scheduler's counters) to `steps`."""

    class Recording(LLMEngine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            schedule: Callable[[], StepPlan] = self.scheduler.schedule

            def recorded() -> StepPlan:
                plan = schedule()
                if plan.chunks:
                    steps.append(_step(plan, self, with_tokens=with_tokens))
                return plan

            self.scheduler.schedule = recorded  # type: ignore[method-assign]

    return Recording


def _real(monkeypatch: pytest.MonkeyPatch, config: JobConfig, *, with_tokens: bool) -> list[Step]:
    steps: list[Step] = []
    with monkeypatch.context() as m:
        m.setattr("batchgen.job.run.LLMEngine", _recording(steps, with_tokens=with_tokens))
        run_job(config, use_tqdm=False)
    return steps


def _simulated(monkeypatch: pytest.MonkeyPatch, config: JobConfig, tokens: TokenSource, *,
               with_tokens: bool) -> tuple[list[Step], dict[str, Any]]:
    steps: list[Step] = []
    with monkeypatch.context() as m:
        m.setattr("batchgen.sim.engine.LLMEngine", _recording(steps, with_tokens=with_tokens))
        # The real run is a CPU's: its block pool reuses written blocks first, so the simulated
        # hardware says its pool is committed on write too (a GPU profile's order differs).
        hardware = dataclasses.replace(load_hardware("h100-sxm"), kv_committed_on_write=True)
        result = simulate_job(config, model=load_sim_model(config.model), hardware=hardware,
                              tokens=tokens, token_source="test", use_tqdm=False)
    return steps, result.summary


def _filler(config: JobConfig) -> Filler:
    model = load_sim_model(config.model)
    return Filler.for_tokenizer(model.tokenizer, model.config.eos_token_ids)


def _replay(config: JobConfig, *, keep_tokens: bool) -> RecordedOutputs:
    outputs = read_recorded_outputs(final_shards(config.resolve_path("out")))
    if not keep_tokens:  # lengths only: the replay emits filler tokens, then EOS
        outputs = {seed: type(r)(None, r.num_tokens, r.stopped) for seed, r in outputs.items()}
    return RecordedOutputs(outputs, filler=_filler(config), eos=2)


def _assert_same_steps(real: list[Step], sim: list[Step]) -> None:
    assert len(sim) == len(real)
    for i, (a, b) in enumerate(zip(real, sim, strict=True)):
        assert b == a, f"step {i} differs"
    last = real[-1]
    assert last[2] >= 1, "the job must preempt"
    assert last[3] >= 32, "the job must hit the prefix cache"
    assert any(len(chunk[2]) > 1 if isinstance(chunk[2], tuple) else chunk[2] > 1
               for step in real for chunk in step[0] if chunk[4] == 0), "prompts must run in chunks"


def test_a_replay_of_recorded_tokens_makes_the_real_step_sequence(tmp_path: Path, model: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Sampled, n = 2: each request's second sample forks from the first at its first token. The
    # replay draws the recorded tokens, so even the generated blocks' contents are the real ones
    # (forked samples of a peaked random model often draw the same tokens: their blocks then
    # hold the same content, which the prefix cache sees).
    config = _config(tmp_path, model, sampling={"max_tokens": 12, "temperature": 1.0, "n": 2})
    real = _real(monkeypatch, config, with_tokens=True)
    sim, summary = _simulated(monkeypatch, config, _replay(config, keep_tokens=True), with_tokens=True)
    _assert_same_steps(real, sim)
    assert any(chunk[4] == 2 for step in real for chunk in step[0])  # forks happened
    lengths = {r.num_tokens for r in read_recorded_outputs(final_shards(config.resolve_path("out"))).values()}
    assert len(lengths) >= 3  # samples did end at different lengths
    assert summary["preemptions"] == real[-1][2] and summary["tokens"]["cached"] == real[-1][3]


def test_a_replay_of_lengths_alone_makes_the_same_schedule(tmp_path: Path, model: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, model, sampling={"max_tokens": 12, "temperature": 1.0})
    real = _real(monkeypatch, config, with_tokens=False)
    sim, _ = _simulated(monkeypatch, config, _replay(config, keep_tokens=False), with_tokens=False)
    _assert_same_steps(real, sim)


def test_max_tokens_with_ignore_eos_makes_the_same_schedule(tmp_path: Path, model: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing recorded: every sample runs to its max_tokens on filler tokens.
    config = _config(tmp_path, model, sampling={"max_tokens": 7, "temperature": 1.0, "ignore_eos": True})
    real = _real(monkeypatch, config, with_tokens=False)
    sim, _ = _simulated(monkeypatch, config, MaxTokens(_filler(config)), with_tokens=False)
    _assert_same_steps(real, sim)


def test_the_comparison_sees_a_different_schedule(tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check can fail: one fewer running sequence in the simulation gives another sequence.
    config = _config(tmp_path, model, sampling={"max_tokens": 7, "temperature": 1.0, "ignore_eos": True})
    real = _real(monkeypatch, config, with_tokens=False)
    other = _config(tmp_path / "other", model, sampling={"max_tokens": 7, "temperature": 1.0, "ignore_eos": True},
                    engine={"max_num_seqs": 5})
    sim, _ = _simulated(monkeypatch, other, MaxTokens(_filler(config)), with_tokens=False)
    assert sim != real


def test_steps_handed_off_in_runs_make_the_same_schedule(tmp_path: Path, model: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A simulation runs many steps in one hand-off to the engine thread and adds the waiting
    # rows there as requests finish; one step per hand-off with the rows added on the event loop
    # (a real run's way) must give the same steps and the same timeline.
    from batchgen.engine.step_thread import StepThread

    config = _config(tmp_path, model, sampling={"max_tokens": 7, "temperature": 1.0, "ignore_eos": True})
    submits: list[int] = []
    real_submit = StepThread.submit

    def counted(self: StepThread, fn: Callable[[], Any]) -> Any:
        submits.append(1)
        return real_submit(self, fn)

    monkeypatch.setattr(StepThread, "submit", counted)
    batched, _ = _simulated(monkeypatch, config, MaxTokens(_filler(config)), with_tokens=True)
    num_batched_submits = len(submits)
    monkeypatch.setattr("batchgen.job.pipeline._MAX_STEPS_PER_HANDOFF", 1)
    monkeypatch.setattr("batchgen.job.pipeline._REFILL_ON_ENGINE_THREAD", False)
    submits.clear()
    single, _ = _simulated(monkeypatch, config, MaxTokens(_filler(config)), with_tokens=True)
    assert batched == single
    assert len(submits) == len(single)  # one step each
    assert num_batched_submits < len(batched) // 2


def test_rows_added_on_the_engine_thread_make_the_same_simulation(tmp_path: Path, model: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # More rows than the engine loop keeps in flight (64), in windows of 16, some of them error
    # rows: the engine thread adds waiting rows as requests finish and hands back when a window
    # runs out. Steps, timeline and summary equal those of one step per hand-off with the rows
    # added on the event loop (a real run's way).
    from batchgen.engine.step_thread import StepThread

    config = _config(tmp_path, model, sampling={"max_tokens": 7, "temperature": 1.0, "ignore_eos": True},
                     num_shards=3, rows_per_shard=50, window_rows=16, bad_every=7)
    submits: list[int] = []
    real_submit = StepThread.submit

    def counted(self: StepThread, fn: Callable[[], Any]) -> Any:
        submits.append(1)
        return real_submit(self, fn)

    def simulated() -> tuple[list[Step], Any]:
        steps: list[Step] = []
        with monkeypatch.context() as m:
            m.setattr("batchgen.sim.engine.LLMEngine", _recording(steps, with_tokens=True))
            m.setattr(StepThread, "submit", counted)
            # The simulated clock starts at the wall clock's time: the same start for both.
            m.setattr("batchgen.sim.job.time", SimpleNamespace(time=lambda: 1.0e9, perf_counter=time.perf_counter))
            hardware = dataclasses.replace(load_hardware("h100-sxm"), kv_committed_on_write=True)
            result = simulate_job(config, model=load_sim_model(config.model), hardware=hardware,
                                  tokens=MaxTokens(_filler(config)), token_source="test", use_tqdm=False)
        summary = {k: v for k, v in result.summary.items() if k != "run"}
        summary["simulated"] = {k: v for k, v in summary["simulated"].items()
                                if k not in ("simulation_s", "rows_per_s_simulated")}
        return steps, (summary, result.timeline.drop_columns(["run_id"]).to_pylist())

    refilled, refilled_out = simulated()
    num_refilled_submits = len(submits)
    monkeypatch.setattr("batchgen.job.pipeline._MAX_STEPS_PER_HANDOFF", 1)
    monkeypatch.setattr("batchgen.job.pipeline._REFILL_ON_ENGINE_THREAD", False)
    submits.clear()
    single, single_out = simulated()
    assert refilled == single
    assert refilled_out == single_out
    summary, timeline = single_out
    assert summary["rows"]["total"] == 150 and summary["rows"]["by_status"]["error"] >= 15
    assert sum(r["error_rows"] for r in timeline) == summary["rows"]["by_status"]["error"]
    assert len(submits) == len(single)  # one step each
    assert num_refilled_submits < len(single) // 4
