"""`enable_chunked_prefill: false`: a prompt's prefill in one step (as before Sarathi-Serve).

Exact plans on a tiny pool, then seeded random workloads: with chunking off every prefill chunk
runs to its sequence's last token, a step passes the token budget only with one prefill, and the
outputs equal the fake model's reference (the helpers of test_scheduler.py).
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.config import SchedulerConfig
from batchgen.engine.scheduler import Scheduler
from batchgen.radix import KVCacheManager
from tests.engine.test_scheduler import EOS, make_seq, reference, step


def make(*, chunked: bool, budget: int | None = 8, num_blocks: int = 10, max_seqs: int = 4,
         batching: str = "continuous", caching: bool = True) -> tuple[Scheduler, KVCacheManager]:
    kv = KVCacheManager(num_blocks, 4, enable_prefix_caching=caching)
    config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                             batching=batching,  # type: ignore[arg-type]
                             admission_reserve_tokens=0, enable_chunked_prefill=chunked)
    return Scheduler(config, kv, max_model_len=1000, eos_token_ids=[EOS]), kv


def shape(plan_chunks: object) -> list[tuple[int, int, int]]:
    return [(c.seq_id, c.start_pos, len(c.token_ids)) for c in plan_chunks]  # type: ignore[attr-defined]


def test_a_prompt_longer_than_the_budget_runs_whole_in_one_step() -> None:
    sched, kv = make(chunked=False, budget=4)
    sched.add(make_seq(0, list(range(1, 11)), max_tokens=2))
    assert shape(step(sched, kv).chunks) == [(0, 0, 10)]
    assert shape(step(sched, kv).chunks) == [(0, 10, 1)]
    # the same prompt with chunking on: three chunks of at most 4 tokens
    sched, kv = make(chunked=True, budget=4)
    sched.add(make_seq(0, list(range(1, 11)), max_tokens=2))
    assert [shape(step(sched, kv).chunks) for _ in range(3)] == [[(0, 0, 4)], [(0, 4, 4)], [(0, 8, 2)]]


def test_a_second_prompt_waits_for_a_step_with_room() -> None:
    sched, kv = make(chunked=False, budget=8)
    sched.add(make_seq(0, [1, 2, 3, 4, 5], max_tokens=3))
    sched.add(make_seq(1, [6, 7, 8, 9, 10], max_tokens=3))
    # 5 + 5 > 8: the second prompt is not cut, it waits; next step: a decode and the whole prompt
    assert shape(step(sched, kv).chunks) == [(0, 0, 5)]
    assert shape(step(sched, kv).chunks) == [(0, 5, 1), (1, 0, 5)]
    sched, kv = make(chunked=True, budget=8)
    sched.add(make_seq(0, [1, 2, 3, 4, 5], max_tokens=3))
    sched.add(make_seq(1, [6, 7, 8, 9, 10], max_tokens=3))
    assert shape(step(sched, kv).chunks) == [(0, 0, 5), (1, 0, 3)]


def test_decodes_come_first_then_a_whole_prompt_past_the_budget() -> None:
    sched, kv = make(chunked=False, budget=4, num_blocks=12)
    sched.add(make_seq(0, [1, 2], max_tokens=5))
    sched.add(make_seq(1, [3, 4], max_tokens=5))
    assert shape(step(sched, kv).chunks) == [(0, 0, 2), (1, 0, 2)]
    sched.add(make_seq(2, list(range(10, 19)), max_tokens=1))
    # two decodes (1 token each), then the 9-token prompt as the step's only prefill: 11 > 4
    assert shape(step(sched, kv).chunks) == [(0, 2, 1), (1, 2, 1), (2, 0, 9)]


def test_static_batches_admit_whole_and_prefill_one_prompt_per_step_when_over_budget() -> None:
    sched, kv = make(chunked=False, budget=6, batching="static", num_blocks=12)
    for i in range(3):
        sched.add(make_seq(i, [i + 1] * 5, max_tokens=2))
    plans = [shape(step(sched, kv).chunks) for _ in range(3)]
    # all three are admitted at once; their prompts run whole, one per step (5 + 5 > 6)
    assert plans[0] == [(0, 0, 5)]
    assert plans[1] == [(0, 5, 1), (1, 0, 5)]
    assert plans[2] == [(1, 5, 1), (2, 0, 5)]


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(8, 16),
    budget=st.sampled_from([None, 3, 8, 32]),
    caching=st.booleans(),
    batching=st.sampled_from(["continuous", "static"]),
)
def test_random_workloads_never_cut_a_prompt(seed: int, num_blocks: int, budget: int | None,
                                             caching: bool, batching: str) -> None:
    rng = random.Random(seed)
    sched, kv = make(chunked=False, budget=budget, num_blocks=num_blocks, max_seqs=rng.randint(1, 5),
                     batching=batching, caching=caching)
    shared = [rng.randrange(1, 6) for _ in range(rng.randint(0, 9))]
    seqs = []
    for i in range(rng.randint(1, 7)):
        prompt = shared + [rng.randrange(1, 6) for _ in range(rng.randint(1, 6))]
        seq = make_seq(i, prompt[: 4 * num_blocks - 16] or [1], max_tokens=rng.randint(1, 6))
        seqs.append((seq, list(seq.token_ids)))
        sched.add(seq)
    for _ in range(500):
        if not sched.has_unfinished():
            break
        plan = step(sched, kv)
        prefills = [c for c in plan.chunks if len(c.token_ids) > 1]
        # every chunk ends at its sequence's last token: it samples (nothing is cut)
        assert all(c.num_samples >= 1 for c in plan.chunks)
        if budget is not None and plan.num_tokens > budget:
            assert len(prefills) == 1
    assert not sched.has_unfinished()
    for seq, prompt in seqs:
        assert seq.token_ids == reference(prompt, seq.params.max_tokens)
    assert kv.num_used_blocks == 0
