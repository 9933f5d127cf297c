"""StepPlan counts its work once, when it is made: the counts equal the chunks' sums."""

from __future__ import annotations

import random

import pytest

from batchgen.engine.step_plan import DecodeBatch, ScheduledChunk, StepPlan


def test_plan_counts_equal_the_sums_over_its_chunks() -> None:
    rng = random.Random(7)
    for _ in range(50):
        chunks = []
        for seq_id in range(rng.randrange(0, 6)):
            start, q = rng.randrange(0, 40), rng.randrange(1, 20)
            chunks.append(ScheduledChunk(seq_id, tuple(range(q)), start, (0,), rng.choice((0, 1, 2))))
        plan = StepPlan(chunks=tuple(chunks), block_copies=())
        assert plan.num_tokens == sum(len(c.token_ids) for c in chunks)
        assert plan.num_sampling_chunks == sum(1 for c in chunks if c.num_samples)
        assert plan.num_context_tokens == sum(c.start_pos + len(c.token_ids) for c in chunks)
        # each query at position p (start_pos <= p < start_pos + q) reads keys 0..p
        assert plan.num_attention_pairs == sum(
            p + 1 for c in chunks for p in range(c.start_pos, c.start_pos + len(c.token_ids))
        )
        assert plan.is_empty == (not chunks)


def test_a_chunk_is_immutable_and_reads_by_name() -> None:
    chunk = ScheduledChunk(seq_id=3, token_ids=(5,), start_pos=9, block_table=(1, 2), num_samples=1)
    assert (chunk.sample_seeds, chunk.num_generated_tokens, chunk.prompt_logits_start) == ((), 0, None)
    with pytest.raises(AttributeError):
        chunk.start_pos = 10  # type: ignore[misc]


def test_decode_columns_count_and_read_as_chunks() -> None:
    rng = random.Random(11)
    for _ in range(50):
        n = rng.randrange(0, 6)
        decodes = DecodeBatch(
            tuple(range(100, 100 + n)),
            tuple(rng.randrange(50) for _ in range(n)),
            tuple(rng.randrange(0, 90) for _ in range(n)),
            tuple((i, i + 1) for i in range(n)),
            tuple(rng.randrange(1 << 30) for _ in range(n)),
            tuple(rng.randrange(1, 30) for _ in range(n)),
        )
        listed = tuple(
            ScheduledChunk(seq_id, tuple(range(3)), rng.randrange(0, 40), (0,), rng.choice((0, 1)))
            for seq_id in range(rng.randrange(0, 3))
        )
        plan = StepPlan(listed, (), decodes)
        chunks = plan.chunks
        assert chunks[:n] == tuple(
            ScheduledChunk(decodes.seq_ids[i], (decodes.token_ids[i],), decodes.start_pos[i],
                           decodes.block_tables[i], 1, (decodes.sample_seeds[i],), decodes.num_generated_tokens[i])
            for i in range(n)
        )
        assert chunks[n:] == listed and plan.listed == listed and plan.num_chunks == len(chunks)
        same = StepPlan(chunks, ())  # the same chunks, all listed: the same work
        assert (plan.num_tokens, plan.num_sampling_chunks, plan.num_context_tokens, plan.num_attention_pairs) == (
            same.num_tokens, same.num_sampling_chunks, same.num_context_tokens, same.num_attention_pairs)
        assert plan.is_empty == (not chunks)


def test_decode_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError):
        StepPlan((), (), DecodeBatch((1, 2), (5, 5), (3, 3), ((0,), (1,)), (9,), (1, 1)))
