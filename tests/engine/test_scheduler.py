"""Scheduler against a fake model: exact plans, block ids, preemption, static batching, forks.

The fake model's next token is a function of all tokens so far, so a sequence's output does not
depend on how it was chunked, preempted or batched: any difference is a scheduler bug.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.config import SchedulerConfig
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.sequence import Sequence, SequenceStatus
from batchgen.engine.step_plan import StepPlan, StepResult
from batchgen.radix import BlockCopy, KVCacheManager

VOCAB = 50
EOS = 49


def next_token(tokens: list[int]) -> int:
    return (sum(tokens) * 31 + len(tokens)) % (VOCAB - 1)  # never EOS


def make_seq(seq_id: int, prompt: list[int], max_tokens: int, *, n: int = 1, sample_index: int = 0) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        request_id=seq_id,
        sample_index=sample_index,
        token_ids=list(prompt),
        num_prompt_tokens=len(prompt),
        params=SamplingParams(max_tokens=max_tokens, temperature=0, n=n),
        seed=0,
    )


def make(num_blocks: int = 10, block_size: int = 4, budget: int | None = 8, max_seqs: int = 4,
         batching: str = "continuous", caching: bool = True,
         reserve: int = 128) -> tuple[Scheduler, KVCacheManager]:
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=caching)
    config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, batching=batching,  # type: ignore[arg-type]
                             admission_reserve_tokens=reserve)
    return Scheduler(config, kv, max_model_len=1000, eos_token_ids=[EOS]), kv


def step(sched: Scheduler, kv: KVCacheManager) -> StepPlan:
    plan = sched.schedule()
    kv.check_invariants()
    sampled = {}
    for c in plan.chunks:
        if c.num_samples:
            seq = sched.get(c.seq_id)
            sampled[c.seq_id] = [next_token(seq.token_ids)] * c.num_samples
    sched.update(plan, StepResult({k: tuple(v) for k, v in sampled.items()}))
    kv.check_invariants()
    return plan


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens


def test_chunked_prefill_then_decode_exact_blocks() -> None:
    sched, kv = make(budget=4)
    seq = make_seq(0, list(range(1, 11)), max_tokens=3)
    sched.add(seq)
    p1 = step(sched, kv)
    assert [(c.seq_id, len(c.token_ids), c.start_pos, c.block_table, c.num_samples) for c in p1.chunks] == [
        (0, 4, 0, (0,), 0)
    ]
    p2 = step(sched, kv)
    assert [(len(c.token_ids), c.start_pos, c.block_table) for c in p2.chunks] == [(4, 4, (0, 1))]
    p3 = step(sched, kv)
    assert [(len(c.token_ids), c.start_pos, c.block_table, c.num_samples) for c in p3.chunks] == [
        (2, 8, (0, 1, 2), 1)
    ]
    assert seq.num_tokens == 11
    p4 = step(sched, kv)  # decode of token 10 fits block 2 (slots 8..11)
    assert [(c.token_ids, c.start_pos, c.block_table) for c in p4.chunks] == [((seq.token_ids[10],), 10, (0, 1, 2))]
    step(sched, kv)
    assert seq.is_finished and seq.finish_reason == "length"
    assert seq.token_ids == reference(list(range(1, 11)), 3)
    assert kv.num_used_blocks == 0
    assert sched.stats().prefill_tokens_computed == 10


def test_decodes_first_then_prefill_chunks() -> None:
    sched, kv = make(budget=4)
    a = make_seq(0, [1, 2, 3], max_tokens=5)
    sched.add(a)
    step(sched, kv)  # a's prompt, first token
    b = make_seq(1, list(range(10, 20)), max_tokens=2)
    sched.add(b)
    plan = step(sched, kv)
    assert [(c.seq_id, len(c.token_ids)) for c in plan.chunks] == [(0, 1), (1, 3)]
    plan = step(sched, kv)
    assert [(c.seq_id, len(c.token_ids)) for c in plan.chunks] == [(0, 1), (1, 3)]


def test_prefix_hit_same_step_and_after_finish() -> None:
    sched, kv = make(budget=None)
    prefix = [5, 6, 7, 8, 9, 10, 11, 12]
    a = make_seq(0, [*prefix, 1], max_tokens=1)
    b = make_seq(1, [*prefix, 2], max_tokens=1)
    sched.add(a)
    sched.add(b)
    plan = step(sched, kv)
    # a computes 9 tokens into blocks 0, 1, 2; b takes a's two full blocks from the cache
    # in the same step and computes only its last token.
    assert [(c.seq_id, c.start_pos, len(c.token_ids), c.block_table) for c in plan.chunks] == [
        (0, 0, 9, (0, 1, 2)),
        (1, 8, 1, (0, 1, 3)),
    ]
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 8
    assert a.is_finished and b.is_finished
    # both finished: blocks 0 and 1 stay cached (MRU end), partial blocks 2 and 3 are reused first
    c = make_seq(2, [*prefix, 3, 4], max_tokens=1)
    sched.add(c)
    plan = step(sched, kv)
    assert plan.chunks[0].start_pos == 8 and plan.chunks[0].block_table[:2] == (0, 1)
    assert sched.stats().cached_prompt_tokens == 16


def test_full_prompt_hit_still_computes_last_token() -> None:
    sched, kv = make(budget=None)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    sched.add(make_seq(0, prompt, max_tokens=1))
    step(sched, kv)
    again = make_seq(1, prompt, max_tokens=1)
    sched.add(again)
    plan = step(sched, kv)
    # the last block cannot be a hit (its last token must be computed): block 0 is, and the
    # first 3 tokens of cached block 1 are copied into the prompt's own second block
    (chunk,) = plan.chunks
    assert (chunk.start_pos, len(chunk.token_ids), chunk.block_table[0]) == (7, 1, 0)
    assert plan.block_copies == (BlockCopy(src=1, dst=chunk.block_table[1]),)
    assert chunk.block_table[1] != 1
    assert again.num_cached_tokens == 7
    assert sched.stats().cached_prompt_tokens == 7


def test_partial_hit_never_copies_a_block_cached_in_the_same_step() -> None:
    sched, kv = make(num_blocks=20, budget=None)
    a = make_seq(0, [1, 2, 3, 4, 5, 6, 70, 71, 72], max_tokens=1)
    b = make_seq(1, [1, 2, 3, 4, 5, 6, 80, 81, 82], max_tokens=1)
    sched.add(a)
    sched.add(b)
    plan = step(sched, kv)
    # b takes a's block 0 (its KV is written by this step's forward pass, before b's
    # attention reads it), but a copy runs before the forward pass: a's block 1 (5 6 70 71),
    # cached in this step, is no source yet
    assert [(c.seq_id, c.start_pos, c.block_table[:2]) for c in plan.chunks] == [(0, 0, (0, 1)), (1, 4, (0, 3))]
    assert plan.block_copies == ()
    # a step later both second blocks hold their KV; c shares 5 6 with each: the tie goes to
    # the block nearest c's place in sorted order, b's (5 6 80 81) before c's (5 6 90 ...)
    c = make_seq(2, [1, 2, 3, 4, 5, 6, 90, 91], max_tokens=1)
    sched.add(c)
    plan = step(sched, kv)
    (chunk,) = plan.chunks
    assert (chunk.start_pos, chunk.block_table[0]) == (6, 0)
    assert plan.block_copies == (BlockCopy(src=3, dst=chunk.block_table[1]),)
    assert c.num_cached_tokens == 6


def test_partial_hit_at_the_root_and_with_caching_off() -> None:
    sched, kv = make(budget=None)
    sched.add(make_seq(0, [1, 2, 3, 4, 5], max_tokens=1))
    step(sched, kv)
    d = make_seq(1, [1, 2, 3, 9, 9], max_tokens=1)  # shares 3 tokens of cached block 0
    sched.add(d)
    plan = step(sched, kv)
    assert [(c.start_pos, len(c.token_ids)) for c in plan.chunks] == [(3, 2)]
    assert plan.block_copies == (BlockCopy(src=0, dst=plan.chunks[0].block_table[0]),)

    sched, kv = make(budget=None, caching=False)
    sched.add(make_seq(0, [1, 2, 3, 4, 5], max_tokens=1))
    step(sched, kv)
    sched.add(make_seq(1, [1, 2, 3, 9, 9], max_tokens=1))
    plan = step(sched, kv)
    assert [(c.start_pos, len(c.token_ids)) for c in plan.chunks] == [(0, 5)]
    assert plan.block_copies == ()


def test_admission_waits_for_free_blocks() -> None:
    sched, kv = make(num_blocks=3, budget=None, caching=False)
    a = make_seq(0, list(range(1, 9)), max_tokens=3)  # 8 prompt tokens: 2 blocks, grows to 3
    b = make_seq(1, list(range(20, 26)), max_tokens=1)  # needs 2 blocks
    sched.add(a)
    sched.add(b)
    plan = step(sched, kv)
    assert [c.seq_id for c in plan.chunks] == [0]
    assert b.status is SequenceStatus.WAITING


def test_preemption_newest_first_and_outputs_unchanged() -> None:
    sched, kv = make(num_blocks=5, budget=None, caching=True, reserve=0)  # no watermark
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
    seqs = [make_seq(i, p, max_tokens=8) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    for _ in range(200):
        if not sched.has_unfinished():
            break
        step(sched, kv)
    assert not sched.has_unfinished()
    assert sched.stats().num_preemptions >= 1
    for s, p in zip(seqs, prompts, strict=True):
        assert s.token_ids == reference(p, 8)
    assert kv.num_used_blocks == 0


def test_watermark_admits_fewer_instead_of_preempting() -> None:
    """Same pool and prompts as above: with the watermark the second sequence waits for room
    instead of being admitted and preempted; outputs are the same."""
    sched, kv = make(num_blocks=5, budget=None, caching=True, reserve=128)
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
    seqs = [make_seq(i, p, max_tokens=8) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    plan = step(sched, kv)
    # seq 0 holds 2 blocks and will need 2 more (6 + 8 tokens): 1 free block is too few for
    # seq 1's 2 prompt blocks plus those reserves
    assert [c.seq_id for c in plan.chunks] == [0]
    assert seqs[1].status is SequenceStatus.WAITING
    for _ in range(200):
        if not sched.has_unfinished():
            break
        step(sched, kv)
    assert sched.stats().num_preemptions == 0
    for s, p in zip(seqs, prompts, strict=True):
        assert s.token_ids == reference(p, 8)
    assert kv.num_used_blocks == 0


def test_watermark_covers_only_the_next_tokens() -> None:
    """A reserve of 4 tokens (one block) lets both run at once in a pool that fits both prompts
    plus one block each."""
    sched, kv = make(num_blocks=6, budget=None, caching=False, reserve=4)
    for i, p in enumerate([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]):
        sched.add(make_seq(i, p, max_tokens=8))
    plan = step(sched, kv)
    assert [c.seq_id for c in plan.chunks] == [0, 1]


def test_static_batching_waits_for_whole_batch() -> None:
    sched, kv = make(budget=None, max_seqs=2, batching="static")
    seqs = [make_seq(i, [i + 1, i + 2], max_tokens=1 + 2 * (i == 0)) for i in range(3)]
    for s in seqs:
        sched.add(s)
    plan = step(sched, kv)
    assert sorted(c.seq_id for c in plan.chunks) == [0, 1]
    assert seqs[1].is_finished and not seqs[0].is_finished
    plan = step(sched, kv)
    assert [c.seq_id for c in plan.chunks] == [0]  # seq 2 waits although there is room
    step(sched, kv)
    assert seqs[0].is_finished
    plan = step(sched, kv)
    assert [c.seq_id for c in plan.chunks] == [2]


def test_fork_shares_prompt_blocks_and_copies_partial_block() -> None:
    sched, kv = make(budget=None)
    parent = make_seq(0, [1, 2, 3, 4, 5, 6], max_tokens=3, n=2)
    child = make_seq(1, [1, 2, 3, 4, 5, 6], max_tokens=3, n=2, sample_index=1)
    sched.add(parent, [child])
    plan = step(sched, kv)
    assert plan.chunks[0].num_samples == 2
    assert child.status is SequenceStatus.RUNNING
    assert kv.block_table(0) == (0, 1)
    assert kv.block_table(1) == (0, 2)  # full block 0 shared, partial block 1 copied into 2
    plan = step(sched, kv)
    assert [(c.src, c.dst) for c in plan.block_copies] == [(1, 2)]
    assert {c.seq_id for c in plan.chunks} == {0, 1}


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(6, 14),
    budget=st.sampled_from([None, 3, 8, 32]),
    caching=st.booleans(),
    batching=st.sampled_from(["continuous", "static"]),
)
def test_random_workloads_match_reference(seed: int, num_blocks: int, budget: int | None, caching: bool,
                                          batching: str) -> None:
    rng = random.Random(seed)
    sched, kv = make(num_blocks=num_blocks, budget=budget, max_seqs=rng.randint(1, 5), batching=batching,
                     caching=caching)
    shared = [rng.randrange(1, 6) for _ in range(rng.randint(0, 9))]
    seqs = []
    for i in range(rng.randint(1, 7)):
        prompt = shared + [rng.randrange(1, 6) for _ in range(rng.randint(1, 6))]
        seq = make_seq(i, prompt[: 4 * num_blocks - 12] or [1], max_tokens=rng.randint(1, 6))
        seqs.append((seq, list(seq.token_ids)))
        sched.add(seq)
    for _ in range(500):
        if not sched.has_unfinished():
            break
        step(sched, kv)
    assert not sched.has_unfinished()
    for seq, prompt in seqs:
        assert seq.token_ids == reference(prompt, seq.params.max_tokens)
    assert kv.num_used_blocks == 0
    assert kv.num_free_blocks == num_blocks
