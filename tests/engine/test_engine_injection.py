"""LLMEngine with an injected runner and clock: latency records and the timeline on that clock.

A fake runner returns one token per sample and advances a fake clock by one second a step, so
every time is exact. Then the plan's sample seeds, the refusal of sizes an injected engine lacks,
and the real model's records on the real clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.seeding import derive_seed
from batchgen.engine.step_plan import StepPlan, StepResult
from batchgen.models.checkpoint import Checkpoint, load_checkpoint
from batchgen.models.config import ModelConfig
from tests.tiny_models import make_tiny_hf_folder, smollm2_tokenizer

TOKEN = 7


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


class OneSecondRunner:
    """Every sample draws TOKEN; each step takes one second on the clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.plans: list[StepPlan] = []

    def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append(plan)
        self.clock.t += 1.0
        return StepResult({c.seq_id: (TOKEN,) * c.num_samples for c in plan.chunks if c.num_samples})


def _checkpoint() -> Checkpoint:
    config = ModelConfig.from_hf_dict({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 256, "eos_token_id": 2,
    })
    return Checkpoint(config, {}, smollm2_tokenizer(), Path("no-weights"), "none")


def _engine(clock: FakeClock, runner: OneSecondRunner, *, max_num_seqs: int = 1) -> LLMEngine:
    return LLMEngine(
        _checkpoint(),
        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=None),
        cache_config=CacheConfig(block_size=4),
        runner_config=RunnerConfig(max_model_len=64),
        runner=runner,
        num_kv_blocks=40,
        clock=clock.now,
    )


def test_latency_records_and_timeline_come_from_the_injected_clock() -> None:
    clock = FakeClock(100.0)
    runner = OneSecondRunner(clock)
    engine = _engine(clock, runner)
    params = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0)
    first = engine.add_request([11, 12, 13, 14], params)  # arrives now: 100
    second = engine.add_request([21, 22, 23, 24], params, arrival_time=100.5)
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step()})
    # One sequence at a time: the first runs steps 1-3 (t 100-103), the second steps 4-6.
    a, b = outs[first].metrics, outs[second].metrics
    assert a is not None and b is not None
    assert (a.arrival_time, a.first_scheduled_time, a.token_times) == (100.0, 100.0, (101.0, 102.0, 103.0))
    assert (a.queue_s, a.ttft_s, a.e2e_s, a.tbt_s) == (0.0, 1.0, 3.0, (1.0, 1.0))
    assert (b.arrival_time, b.first_scheduled_time, b.token_times) == (100.5, 103.0, (104.0, 105.0, 106.0))
    assert (b.queue_s, b.ttft_s, b.e2e_s, b.tbt_s) == (2.5, 3.5, 5.5, (1.0, 1.0))
    assert outs[first].outputs[0].token_ids == (TOKEN,) * 3
    rows = engine.timeline.rows()
    assert (rows[0].t_start, rows[-1].t_end) == (100.0, 106.0)
    assert sum(r.step_s for r in rows) == 6.0 and sum(r.num_steps for r in rows) == 6
    # Work counts: per request a 4-token prefill (context 4, pairs 10), then decodes at 4 and 5.
    assert sum(r.context_tokens for r in rows) == 2 * (4 + 5 + 6)
    assert sum(r.attention_pairs for r in rows) == 2 * (10 + 5 + 6)


def test_the_plan_carries_each_samples_seed_and_token_index() -> None:
    clock = FakeClock(0.0)
    runner = OneSecondRunner(clock)
    engine = _engine(clock, runner, max_num_seqs=4)
    engine.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=3, ignore_eos=True, n=2, seed=9, temperature=1.0))
    while engine.has_unfinished():
        engine.step()
    first, second, third = runner.plans
    parent, child = derive_seed(9, 0), derive_seed(9, 1)  # the request's seed, then each sample's
    # The fork draws both samples' first tokens from the parent's chunk, in StepResult order.
    assert [(c.seq_id, c.num_samples, c.sample_seeds, c.num_generated_tokens) for c in first.chunks] == [
        (0, 2, (parent, child), 0)
    ]
    assert [(c.seq_id, c.sample_seeds, c.num_generated_tokens) for c in second.chunks] == [
        (0, (parent,), 1), (1, (child,), 1)
    ]
    assert [c.num_generated_tokens for c in third.chunks] == [2, 2]


def test_an_injected_engine_needs_its_pool_size_and_has_no_model() -> None:
    clock = FakeClock(0.0)
    runner = OneSecondRunner(clock)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        LLMEngine(_checkpoint(), scheduler_config=SchedulerConfig(), cache_config=CacheConfig(),
                  runner_config=RunnerConfig(max_model_len=64), runner=runner)
    with pytest.raises(ValueError, match="injected runner"):
        LLMEngine(_checkpoint(), scheduler_config=SchedulerConfig(), cache_config=CacheConfig(),
                  runner_config=RunnerConfig(max_model_len=64), num_kv_blocks=40)
    with pytest.raises(RuntimeError, match="injected runner"):
        _ = _engine(clock, runner).runner


def test_a_real_engine_keeps_latency_records_on_the_wall_clock(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(tmp_path, num_heads=4, num_kv_heads=2, hidden_size=64)
    engine = LLMEngine(
        load_checkpoint(folder),
        scheduler_config=SchedulerConfig(max_num_seqs=2),
        cache_config=CacheConfig(),
        runner_config=RunnerConfig(device="cpu"),
    )
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=4, ignore_eos=True, temperature=0))
    outs = []
    while engine.has_unfinished():
        outs.extend(engine.step())
    assert len(outs) == 3
    for out in outs:
        m = out.metrics
        assert m is not None and len(m.token_times) == len(out.outputs[0].token_ids) == 4
        assert m.arrival_time <= m.first_scheduled_time < m.token_times[0]
        assert all(g >= 0 for g in m.tbt_s) and m.e2e_s >= m.ttft_s
    # max_num_seqs 2: the third request waited for a slot.
    third = next(o for o in outs if o.prompt_token_ids == tuple(prompts[2])).metrics
    assert third is not None and third.queue_s > 0


class WordRunner(OneSecondRunner):
    """Every sample draws WORD (a token with text); each step takes one second."""

    def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append(plan)
        self.clock.t += 1.0
        return StepResult({c.seq_id: (WORD,) * c.num_samples for c in plan.chunks if c.num_samples})


WORD = 1500  # " langu"


def _word_engine(*, decode_text: bool = True) -> LLMEngine:
    clock = FakeClock(0.0)
    return LLMEngine(
        _checkpoint(),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=None),
        cache_config=CacheConfig(block_size=4),
        runner_config=RunnerConfig(max_model_len=64),
        runner=WordRunner(clock),
        num_kv_blocks=40,
        clock=clock.now,
        decode_text=decode_text,
    )


def _run_all(engine: LLMEngine) -> list[list[int]]:
    """The request ids each step returned, step by step."""
    steps = []
    while engine.has_unfinished():
        steps.append([out.request_id for out in engine.step()])
    return steps


def test_requests_finished_in_one_step_come_out_in_plan_order() -> None:
    engine = _word_engine()
    length = SamplingParams(max_tokens=2, ignore_eos=True)
    ids = [engine.add_request([1, 2, 3, 4, 5], length) for _ in range(3)]
    assert _run_all(engine) == [[], ids]
    # `a` is first in the plan and ends on its stop string, which the engine finds after the
    # scheduler has ended b and c on their length: it still comes first.
    engine = _word_engine()
    a = engine.add_request([1, 2, 3], SamplingParams(max_tokens=8, stop=[" langu langu"]))
    b = engine.add_request([1, 2, 3, 4], length)
    c = engine.add_request([1, 2, 3, 4, 5], length)
    assert _run_all(engine) == [[], [a, b, c]]


def test_only_the_first_sample_keeps_token_times() -> None:
    engine = _word_engine()
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True, n=2, seed=1, temperature=1.0))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
        assert engine._scratch_times == []  # the other samples' times are dropped every step
    (out,) = outs
    assert out.metrics is not None and out.metrics.token_times == (1.0, 2.0, 3.0)
    assert [len(o.token_ids) for o in out.outputs] == [3, 3]


def test_an_engine_without_text_decodes_only_requests_with_stop_strings() -> None:
    engine = _word_engine(decode_text=False)
    plain = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    stopped = engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=2, ignore_eos=True, stop=["zz"]))
    texts = {}
    while engine.has_unfinished():
        texts.update({o.request_id: o.outputs[0].text for o in engine.step()})
    assert texts == {plain: "", stopped: " langu langu"}
    engine = _word_engine()
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    (out,) = engine.step() + engine.step()
    assert out.outputs[0].text == " langu langu"
