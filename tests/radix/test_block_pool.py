"""BlockPool: exact ref counts and free-queue order on a pool of ten blocks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.radix.block_pool import BlockPool


def _pool(num_blocks: int = 10) -> BlockPool:
    pool = BlockPool(num_blocks, 4)
    pool.check_invariants()
    return pool


def test_starts_all_free_in_id_order() -> None:
    pool = _pool()
    assert (pool.num_blocks, pool.block_size) == (10, 4)
    assert (pool.num_free_blocks, pool.num_used_blocks) == (10, 0)
    assert pool.free_order() == list(range(10))
    assert [pool.ref_count(b) for b in range(10)] == [0] * 10


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "name"), [(0, 4, "num_blocks"), (1, 0, "block_size")]
)
def test_rejects_bad_sizes(num_blocks: int, block_size: int, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        BlockPool(num_blocks, block_size)


def test_pop_free_takes_lru_head_until_empty() -> None:
    pool = _pool(3)
    assert pool.pop_free() == 0
    pool.check_invariants()
    assert pool.ref_count(0) == 1
    assert pool.free_order() == [1, 2]
    assert pool.pop_free() == 1
    assert pool.pop_free() == 2
    pool.check_invariants()
    assert pool.pop_free() is None
    assert (pool.num_free_blocks, pool.num_used_blocks) == (0, 3)


def test_decref_keep_goes_to_tail_and_not_keep_to_head() -> None:
    pool = _pool()
    assert [pool.pop_free() for _ in range(3)] == [0, 1, 2]
    pool.decref(1, keep=True)
    pool.check_invariants()
    assert pool.free_order() == [3, 4, 5, 6, 7, 8, 9, 1]
    pool.decref(2, keep=False)
    pool.check_invariants()
    assert pool.free_order() == [2, 3, 4, 5, 6, 7, 8, 9, 1]
    pool.decref(0, keep=True)
    pool.check_invariants()
    assert pool.free_order() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    # Reuse order: nothing-to-keep first, then the LRU of the kept ones.
    assert [pool.pop_free() for _ in range(10)] == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    assert pool.pop_free() is None


def test_lazily_committed_pool_reuses_written_blocks_before_fresh_ones() -> None:
    # The same frees as above: a kept block is reused before a fresh one, still LRU among the
    # kept, and a block with nothing to keep before either.
    pool = BlockPool(10, 4, is_lazily_committed=True)
    assert pool.is_lazily_committed and not _pool().is_lazily_committed
    assert pool.free_order() == list(range(10))
    assert [pool.pop_free() for _ in range(3)] == [0, 1, 2]
    assert pool.num_handed_out_blocks == 3
    pool.decref(1, keep=True)
    pool.check_invariants()
    assert pool.free_order() == [1, 3, 4, 5, 6, 7, 8, 9]
    pool.decref(2, keep=False)
    pool.check_invariants()
    assert pool.free_order() == [2, 1, 3, 4, 5, 6, 7, 8, 9]
    pool.decref(0, keep=True)
    pool.check_invariants()
    assert pool.free_order() == [2, 1, 0, 3, 4, 5, 6, 7, 8, 9]
    assert pool.num_handed_out_blocks == 3
    assert [pool.pop_free() for _ in range(4)] == [2, 1, 0, 3]
    assert pool.num_handed_out_blocks == 4
    pool.check_invariants()


def test_handed_out_blocks_count_each_block_once() -> None:
    pool = _pool(4)
    assert pool.num_handed_out_blocks == 0
    pool.incref(2)  # a fresh block taken by incref counts as handed out
    assert pool.pop_free() == 0
    pool.decref(0, keep=False)
    assert pool.pop_free() == 0  # reused: not counted again
    assert pool.num_handed_out_blocks == 2
    assert pool.free_order() == [1, 3]


def test_incref_touches_a_free_block_out_of_the_queue() -> None:
    pool = _pool(4)
    pool.incref(2)
    pool.check_invariants()
    assert pool.ref_count(2) == 1
    assert pool.free_order() == [0, 1, 3]
    pool.incref(2)
    assert pool.ref_count(2) == 2
    pool.decref(2, keep=True)
    pool.check_invariants()
    assert pool.ref_count(2) == 1
    assert pool.free_order() == [0, 1, 3]
    pool.decref(2, keep=True)
    pool.check_invariants()
    assert pool.free_order() == [0, 1, 3, 2]
    assert (pool.num_free_blocks, pool.num_used_blocks) == (4, 0)


def test_decref_below_zero_raises_and_changes_nothing() -> None:
    pool = _pool(2)
    with pytest.raises(ValueError, match="already 0"):
        pool.decref(1, keep=True)
    pool.check_invariants()
    assert pool.free_order() == [0, 1]


@pytest.mark.parametrize("block_id", [-1, 10])
def test_rejects_block_id_outside_pool(block_id: int) -> None:
    pool = _pool()
    with pytest.raises(ValueError, match="block_id"):
        pool.ref_count(block_id)
    with pytest.raises(ValueError, match="block_id"):
        pool.incref(block_id)
    with pytest.raises(ValueError, match="block_id"):
        pool.decref(block_id, keep=False)


def test_check_invariants_detects_corruption() -> None:
    pool = _pool(3)
    pool._ref_counts[1] = 1  # white-box: a count without leaving the queue
    with pytest.raises(AssertionError, match="block 1"):
        pool.check_invariants()


_OPS = st.lists(
    st.tuples(st.sampled_from(["pop", "incref", "decref"]), st.integers(0, 5), st.booleans()),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS)
def test_matches_a_naive_list_model(ops: list[tuple[str, int, bool]]) -> None:
    """One list, as the pool was first written: fresh blocks in the middle, a block with
    nothing to keep inserted at the head, a kept one appended at the tail."""
    pool = BlockPool(6, 2)
    counts = [0] * 6
    free = list(range(6))  # LRU head first
    for op, block_id, keep in ops:
        if op == "pop":
            expected = free.pop(0) if free else None
            assert pool.pop_free() == expected
            if expected is not None:
                counts[expected] = 1
        elif op == "incref":
            pool.incref(block_id)
            if counts[block_id] == 0:
                free.remove(block_id)
            counts[block_id] += 1
        elif counts[block_id] == 0:
            with pytest.raises(ValueError):
                pool.decref(block_id, keep=keep)
        else:
            pool.decref(block_id, keep=keep)
            counts[block_id] -= 1
            if counts[block_id] == 0:
                if keep:
                    free.append(block_id)
                else:
                    free.insert(0, block_id)
        pool.check_invariants()
        assert pool.free_order() == free
        assert [pool.ref_count(b) for b in range(6)] == counts
        assert pool.num_free_blocks + pool.num_used_blocks == 6


@settings(max_examples=200, deadline=None)
@given(ops=_OPS)
def test_lazily_committed_matches_a_naive_model(ops: list[tuple[str, int, bool]]) -> None:
    """Pop order: a block freed with nothing to keep (last freed first), then the kept ones
    (LRU first), then the never handed out (by id); so a fresh block is handed out only when
    every block handed out before is in use, and those number the peak of blocks in use."""
    pool = BlockPool(6, 2, is_lazily_committed=True)
    counts = [0] * 6
    unkept: list[int] = []
    kept: list[int] = []
    fresh = list(range(6))
    handed_out: set[int] = set()
    peak_used = num_fresh_increfs = 0
    for op, block_id, keep in ops:
        if op == "pop":
            part = next((p for p in (unkept, kept, fresh) if p), None)
            expected = None if part is None else part.pop(0)
            assert pool.pop_free() == expected
            if expected is not None:
                counts[expected] = 1
                handed_out.add(expected)
        elif op == "incref":
            pool.incref(block_id)
            num_fresh_increfs += block_id in fresh
            if counts[block_id] == 0:
                for part in (unkept, kept, fresh):
                    if block_id in part:
                        part.remove(block_id)
            counts[block_id] += 1
            handed_out.add(block_id)
        elif counts[block_id] == 0:
            with pytest.raises(ValueError):
                pool.decref(block_id, keep=keep)
        else:
            pool.decref(block_id, keep=keep)
            counts[block_id] -= 1
            if counts[block_id] == 0:
                if keep:
                    kept.append(block_id)
                else:
                    unkept.insert(0, block_id)
        pool.check_invariants()
        peak_used = max(peak_used, pool.num_used_blocks)
        assert pool.free_order() == unkept + kept + fresh
        assert [pool.ref_count(b) for b in range(6)] == counts
        assert pool.num_handed_out_blocks == len(handed_out)
        # pop_free takes a fresh block only when every block handed out is in use; an incref
        # may take any fresh block (the engine increfs only cached, so written, ones)
        assert peak_used <= pool.num_handed_out_blocks <= peak_used + num_fresh_increfs
