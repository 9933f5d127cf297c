"""KVCacheManager: exact block tables, ref counts, free order and evictions on ten blocks of 4."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from batchgen.radix import hashing
from batchgen.radix import radix_cache as radix_cache_module
from batchgen.radix.kv_cache_manager import BlockCopy, ForkResult, KVCacheManager
from batchgen.radix.radix_cache import CacheMatch, CacheStats

A = [1, 2, 3, 4]
B = [5, 6, 7, 8]
C = [9, 10, 11, 12]
D = [13, 14, 15, 16]
TAIL = [17, 18]


def _manager(*, enable_prefix_caching: bool = True) -> KVCacheManager:
    manager = KVCacheManager(10, 4, enable_prefix_caching=enable_prefix_caching)
    manager.check_invariants()
    return manager


def _refs(manager: KVCacheManager) -> list[int]:
    return [manager._pool.ref_count(b) for b in range(manager.num_blocks)]  # white-box read


def _free_order(manager: KVCacheManager) -> list[int]:
    return manager._pool.free_order()  # white-box read


def _is_cached(manager: KVCacheManager, block_id: int) -> bool:
    return manager._cache.is_cached(block_id)  # white-box read


def _run(manager: KVCacheManager, seq_id: int, token_ids: Sequence[int]) -> tuple[int, ...]:
    """Admit ``seq_id`` with its cache hit (all but the last token), compute, cache its blocks."""
    hit = manager.match_prefix(token_ids[:-1])
    assert manager.allocate(seq_id, len(token_ids), hit)
    manager.check_invariants()
    manager.cache_blocks(seq_id, token_ids, len(token_ids))
    manager.check_invariants()
    return manager.block_table(seq_id)


def _free(manager: KVCacheManager, seq_id: int) -> None:
    manager.free(seq_id)
    manager.check_invariants()


def test_properties_and_blocks_needed() -> None:
    manager = _manager()
    assert (manager.num_blocks, manager.block_size) == (10, 4)
    assert (manager.num_free_blocks, manager.num_used_blocks) == (10, 0)
    assert manager.enable_prefix_caching
    assert [manager.num_blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match="num_tokens"):
        manager.num_blocks_needed(-1)


def test_allocate_then_grow_append_only() -> None:
    manager = _manager()
    assert manager.can_allocate(1, 6)
    assert manager.allocate(1, 6)
    manager.check_invariants()
    assert manager.has_table(1)
    assert manager.block_table(1) == (0, 1)
    assert manager.allocate(1, 8)  # still two blocks
    assert manager.block_table(1) == (0, 1)
    assert manager.allocate(1, 3)  # a table never shrinks
    assert manager.allocate(1, 9)
    manager.check_invariants()
    assert manager.block_table(1) == (0, 1, 2)
    assert _refs(manager)[:4] == [1, 1, 1, 0]
    assert _free_order(manager) == [3, 4, 5, 6, 7, 8, 9]
    assert (manager.num_free_blocks, manager.num_used_blocks) == (7, 3)


def test_hit_after_free_reuses_the_full_blocks() -> None:
    manager = _manager()
    tokens = A + B + TAIL
    assert _run(manager, 1, tokens) == (0, 1, 2)
    assert [_is_cached(manager, b) for b in (0, 1, 2)] == [True, True, False]
    _free(manager, 1)
    # Tail first: partial block 2 (nothing cached) to the head, then 1 and 0 to the tail.
    assert _free_order(manager) == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    hit = manager.match_prefix(tokens[:-1])
    assert hit == CacheMatch(block_ids=(0, 1), num_tokens=8)
    assert manager.allocate(2, len(tokens), hit)
    manager.check_invariants()
    assert manager.block_table(2) == (0, 1, 2)
    assert _refs(manager)[:3] == [1, 1, 1]
    assert _free_order(manager) == [3, 4, 5, 6, 7, 8, 9]
    assert manager.stats() == CacheStats(num_lookups=2, num_hit_tokens=8, num_cached_blocks=2)


def test_partial_block_is_never_cached() -> None:
    manager = _manager()
    tokens = A + B[:3]
    assert _run(manager, 1, tokens) == (0, 1)
    assert [_is_cached(manager, b) for b in (0, 1)] == [True, False]
    assert manager.match_prefix(tokens) == CacheMatch(block_ids=(0,), num_tokens=4)
    # The sequence grows to fill block 1: now it is cached.
    manager.cache_blocks(1, A + B, 8)
    manager.check_invariants()
    assert _is_cached(manager, 1)


def test_cache_blocks_hashes_each_block_once(monkeypatch: pytest.MonkeyPatch) -> None:
    real_hasher = hashing.block_hasher
    calls: list[tuple[int, ...]] = []

    def counting_hasher(block_size: int, seed: int = 0) -> Callable[[int, Sequence[int], int], int]:
        hasher = real_hasher(block_size, seed)

        def counting(parent_hash: int, token_ids: Sequence[int], extra_key: int = 0) -> int:
            calls.append(tuple(token_ids))
            return hasher(parent_hash, token_ids, extra_key)

        return counting

    monkeypatch.setattr(radix_cache_module, "block_hasher", counting_hasher)
    manager = KVCacheManager(10, 4)
    tokens = list(range(100, 140))
    for num_tokens in range(1, 41):  # one decode step at a time
        assert manager.allocate(1, num_tokens)
        manager.cache_blocks(1, tokens, num_tokens)
    assert calls == [tuple(tokens[i : i + 4]) for i in range(0, 40, 4)]


def test_lru_evicts_leaves_least_recent_first() -> None:
    manager = _manager()
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    assert _run(manager, 2, C + TAIL) == (3, 4)
    _free(manager, 1)  # queue: 2 | 5..9 | 1, 0
    _free(manager, 2)  # queue: 4, 2 | 5..9 | 1, 0 | 3
    assert _free_order(manager) == [4, 2, 5, 6, 7, 8, 9, 1, 0, 3]
    assert manager.allocate(3, 28)  # seven uncached blocks: nothing evicted
    assert manager.block_table(3) == (4, 2, 5, 6, 7, 8, 9)
    assert manager.stats().num_evictions == 0
    assert manager.allocate(4, 4)  # the leaf B (block 1) goes first, then its parent A
    manager.check_invariants()
    assert manager.block_table(4) == (1,)
    assert manager.stats().num_evictions == 1
    assert not _is_cached(manager, 1)
    assert manager.match_prefix(A + B + TAIL) == CacheMatch(block_ids=(0,), num_tokens=4)
    assert manager.allocate(5, 4)
    manager.check_invariants()
    assert manager.block_table(5) == (0,)
    assert manager.match_prefix(A + B) == CacheMatch()
    assert manager.match_prefix(C + TAIL) == CacheMatch(block_ids=(3,), num_tokens=4)
    assert manager.stats().num_evictions == 2
    assert _free_order(manager) == [3]


def test_free_releases_tail_first() -> None:
    manager = _manager()
    assert _run(manager, 1, A + B + C + TAIL) == (0, 1, 2, 3)
    _free(manager, 1)
    assert _free_order(manager) == [3, 4, 5, 6, 7, 8, 9, 2, 1, 0]
    assert _refs(manager) == [0] * 10


def test_shared_prefix_leaves_the_free_queue_last() -> None:
    manager = _manager()
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    assert _run(manager, 2, A + C + TAIL) == (0, 3, 4)
    assert _refs(manager)[:5] == [2, 1, 1, 1, 1]
    _free(manager, 1)
    assert _free_order(manager) == [2, 5, 6, 7, 8, 9, 1]
    _free(manager, 2)
    assert _free_order(manager) == [4, 2, 5, 6, 7, 8, 9, 1, 3, 0]


def test_referenced_blocks_are_never_evicted() -> None:
    manager = _manager()
    assert _run(manager, 1, A + TAIL) == (0, 1)
    _free(manager, 1)  # queue: 1 | 2..9 | 0
    hit = manager.match_prefix(A + TAIL[:1])
    assert hit == CacheMatch(block_ids=(0,), num_tokens=4)
    assert manager.allocate(2, 5, hit)  # touches block 0 out of the free queue
    assert manager.block_table(2) == (0, 1)
    assert manager.allocate(3, 32)  # every other block
    manager.check_invariants()
    assert manager.block_table(3) == (2, 3, 4, 5, 6, 7, 8, 9)
    assert manager.num_free_blocks == 0
    assert not manager.can_allocate(4, 1)
    assert not manager.allocate(4, 1)
    assert _is_cached(manager, 0)
    assert manager.stats().num_evictions == 0


def _snapshot(manager: KVCacheManager) -> tuple[object, ...]:
    tables = {s: manager.block_table(s) for s in (1, 2, 3) if manager.has_table(s)}
    return (tables, _refs(manager), _free_order(manager), manager.stats())


def test_allocate_short_returns_false_and_changes_nothing() -> None:
    manager = _manager()
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    _free(manager, 1)
    hit = manager.match_prefix(A + B + TAIL)
    assert hit == CacheMatch(block_ids=(0, 1), num_tokens=8)
    before = _snapshot(manager)
    # 11 blocks: 9 new + the 2 hit blocks, which sit in the free queue: 11 > 10 free.
    assert not manager.can_allocate(2, 44, hit)
    assert not manager.allocate(2, 44, hit)
    manager.check_invariants()
    assert _snapshot(manager) == before
    assert not manager.has_table(2)
    # 10 blocks fit exactly.
    assert manager.can_allocate(2, 40, hit)
    assert manager.allocate(2, 40, hit)
    manager.check_invariants()
    assert manager.block_table(2) == (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    # Growing past the pool: False, nothing changes.
    before = _snapshot(manager)
    assert not manager.allocate(2, 41)
    assert _snapshot(manager) == before


def test_hit_block_held_by_another_sequence_costs_no_free_block() -> None:
    manager = _manager()
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    hit = manager.match_prefix(A + B + TAIL)
    assert manager.num_free_blocks == 7
    assert not manager.can_allocate(2, 40, hit)  # 8 new needed
    assert manager.can_allocate(2, 36, hit)  # 7 new
    assert manager.allocate(2, 36, hit)
    manager.check_invariants()
    assert manager.block_table(2) == (0, 1, 3, 4, 5, 6, 7, 8, 9)
    assert _refs(manager) == [2, 2, 1, 1, 1, 1, 1, 1, 1, 1]


def test_fork_with_partial_block_returns_a_copy() -> None:
    manager = _manager()
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    result = manager.fork(1, 2, 10)
    manager.check_invariants()
    assert result == ForkResult(copy=BlockCopy(src=2, dst=3))
    assert manager.block_table(2) == (0, 1, 3)
    assert _refs(manager)[:5] == [2, 2, 1, 1, 0]
    # The child continues its own tokens: its block 3 gets cached under block 1.
    child_tokens = A + B + TAIL + [99, 98]
    manager.cache_blocks(2, child_tokens, 12)
    manager.check_invariants()
    assert manager.match_prefix(child_tokens) == CacheMatch(block_ids=(0, 1, 3), num_tokens=12)


def test_fork_on_block_boundary_copies_nothing() -> None:
    manager = _manager()
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    assert manager.fork(1, 2, 8) == ForkResult(copy=None)
    manager.check_invariants()
    assert manager.block_table(2) == (0, 1)
    assert manager.fork(1, 3, 0) == ForkResult(copy=None)
    assert manager.block_table(3) == ()
    assert _free_order(manager) == [3, 4, 5, 6, 7, 8, 9]
    assert _refs(manager)[:3] == [2, 2, 1]


def test_fork_without_a_free_block_returns_none_and_changes_nothing() -> None:
    manager = _manager()
    assert manager.allocate(1, 40)
    before = _snapshot(manager)
    assert manager.fork(1, 2, 10) is None
    manager.check_invariants()
    assert _snapshot(manager) == before
    assert not manager.has_table(2)
    assert manager.fork(1, 2, 8) == ForkResult(copy=None)  # no copy: no block needed


def test_fork_argument_errors() -> None:
    manager = _manager()
    assert manager.allocate(1, 6)
    assert manager.allocate(2, 1)
    with pytest.raises(KeyError):
        manager.fork(7, 3, 1)
    with pytest.raises(ValueError, match="already has"):
        manager.fork(1, 2, 4)
    with pytest.raises(ValueError, match="num_tokens"):
        manager.fork(1, 3, 9)
    manager.check_invariants()


def test_duplicate_content_is_not_cached_twice() -> None:
    manager = _manager()
    # Both admitted before either cached anything: both compute A + B.
    assert manager.allocate(1, 10)
    assert manager.allocate(2, 10)
    assert manager.block_table(2) == (3, 4, 5)
    manager.cache_blocks(1, A + B + TAIL, 10)
    manager.cache_blocks(2, A + B + TAIL, 10)
    manager.check_invariants()
    assert [_is_cached(manager, b) for b in (0, 1, 3, 4)] == [True, True, False, False]
    _free(manager, 2)  # nothing of it is cached: all to the head, reused first
    assert _free_order(manager) == [3, 4, 5, 6, 7, 8, 9]
    _free(manager, 1)
    assert _free_order(manager) == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]


def test_conflict_position_is_retried_after_its_block_is_evicted() -> None:
    manager = _manager()
    assert _run(manager, 1, A + TAIL) == (0, 1)
    assert manager.allocate(2, 6)  # computes A + TAIL again, no hit given
    assert manager.block_table(2) == (2, 3)
    manager.cache_blocks(2, A + TAIL, 6)
    assert not _is_cached(manager, 2)
    _free(manager, 1)  # queue: 1 | 4..9 | 0
    assert manager.allocate(3, 32)  # takes 1, 4..9 and evicts cached block 0
    assert manager.block_table(3) == (1, 4, 5, 6, 7, 8, 9, 0)
    manager.cache_blocks(2, A + B, 8)
    manager.check_invariants()
    assert manager.match_prefix(A + B) == CacheMatch(block_ids=(2, 3), num_tokens=8)


def test_stale_hit_raises() -> None:
    manager = _manager()
    assert _run(manager, 1, A + TAIL) == (0, 1)
    _free(manager, 1)
    hit = manager.match_prefix(A + TAIL)
    assert hit == CacheMatch(block_ids=(0,), num_tokens=4)
    assert manager.allocate(2, 40)  # evicts block 0
    _free(manager, 2)
    with pytest.raises(ValueError, match="stale hit"):
        manager.can_allocate(3, 6, hit)
    with pytest.raises(ValueError, match="stale hit"):
        manager.allocate(3, 6, hit)
    assert not manager.has_table(3)


def test_allocate_argument_errors() -> None:
    manager = _manager()
    assert _run(manager, 1, A + TAIL) == (0, 1)
    hit = manager.match_prefix(A + TAIL)
    with pytest.raises(ValueError, match="hit must be None"):
        manager.allocate(1, 8, hit)
    with pytest.raises(ValueError, match="num_tokens"):
        manager.allocate(2, 3, hit)
    with pytest.raises(ValueError, match="num_tokens"):
        manager.allocate(2, -1)
    with pytest.raises(ValueError, match="hit.num_tokens"):
        manager.allocate(2, 8, CacheMatch(block_ids=(0,), num_tokens=3))
    manager.check_invariants()


def test_cache_blocks_argument_errors() -> None:
    manager = _manager()
    assert manager.allocate(1, 4)
    with pytest.raises(KeyError):
        manager.cache_blocks(2, A, 4)
    with pytest.raises(ValueError, match="num_tokens"):
        manager.cache_blocks(1, A[:3], 4)
    with pytest.raises(ValueError, match="needs 2 blocks"):
        manager.cache_blocks(1, A + B, 8)
    manager.check_invariants()


def test_unknown_seq_raises_key_error() -> None:
    manager = _manager()
    assert not manager.has_table(1)
    with pytest.raises(KeyError):
        manager.block_table(1)
    with pytest.raises(KeyError):
        manager.free(1)


def test_prefix_caching_off() -> None:
    manager = _manager(enable_prefix_caching=False)
    assert not manager.enable_prefix_caching
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    assert manager.match_prefix(A + B + TAIL) == CacheMatch()
    _free(manager, 1)
    assert _free_order(manager) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert manager.stats() == CacheStats()
    with pytest.raises(ValueError, match="prefix caching is off"):
        manager.allocate(2, 8, CacheMatch(block_ids=(0,), num_tokens=4))


def test_all_blocks_come_back_after_freeing_everything() -> None:
    manager = _manager()
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    assert _run(manager, 2, A + B + C) == (0, 1, 3)
    assert manager.fork(2, 3, 10) == ForkResult(copy=BlockCopy(src=3, dst=4))
    for seq_id in (2, 1, 3):
        _free(manager, seq_id)
    assert (manager.num_free_blocks, manager.num_used_blocks) == (10, 0)
    assert _refs(manager) == [0] * 10


def test_check_invariants_detects_a_cached_parent_ahead_of_its_child() -> None:
    manager = _manager()
    manager._cache.insert(A + B, [0, 1])  # white-box: cached, unreferenced, parent at the head
    with pytest.raises(AssertionError, match="precedes its child"):
        manager.check_invariants()
    with pytest.raises(AssertionError, match="not a leaf"):
        manager.allocate(1, 4)


def test_cached_chain_token_ids_reads_the_chain_from_the_root() -> None:
    manager = _manager()
    assert manager.allocate(0, 10)
    manager.cache_blocks(0, A + B + TAIL, 10)
    table = manager.block_table(0)
    assert manager.cached_chain_token_ids(table[0]) == tuple(A)
    assert manager.cached_chain_token_ids(table[1]) == tuple(A + B)
    assert manager.cached_chain_token_ids(table[2]) is None  # partial: never cached
    manager.check_invariants()


def test_lazily_committed_pool_evicts_lru_before_taking_a_fresh_block() -> None:
    # The frees of test_lru_evicts_leaves_least_recent_first, on a pool whose memory is committed
    # as blocks are first written: the written blocks come back first (the cached ones still
    # leaves first, least recently used first), the never-used 5..9 last.
    manager = KVCacheManager(10, 4, is_lazily_committed=True)
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    assert _run(manager, 2, C + TAIL) == (3, 4)
    _free(manager, 1)
    assert _free_order(manager) == [2, 1, 0, 5, 6, 7, 8, 9]
    _free(manager, 2)
    assert _free_order(manager) == [4, 2, 1, 0, 3, 5, 6, 7, 8, 9]
    assert manager.allocate(3, 16)  # two uncached blocks, then the leaf B and its parent A
    manager.check_invariants()
    assert manager.block_table(3) == (4, 2, 1, 0)
    assert manager.stats().num_evictions == 2
    assert manager.match_prefix(A + B + TAIL) == CacheMatch()
    assert manager.match_prefix(C + TAIL) == CacheMatch(block_ids=(3,), num_tokens=4)
    assert manager.num_handed_out_blocks == 5
    assert manager.allocate(4, 8)  # C is evicted before a first never-used block is taken
    manager.check_invariants()
    assert manager.block_table(4) == (3, 5)
    assert manager.stats().num_evictions == 3
    assert manager.num_handed_out_blocks == 6


def test_lazily_committed_pool_keeps_a_hit_until_its_block_is_needed() -> None:
    manager = KVCacheManager(10, 4, is_lazily_committed=True)
    assert _run(manager, 1, A + B + TAIL) == (0, 1, 2)
    _free(manager, 1)
    assert _run(manager, 2, A + B + TAIL) == (0, 1, 2)  # a hit: nothing recomputed
    assert manager.stats() == CacheStats(num_lookups=2, num_hit_tokens=8, num_cached_blocks=2)
    assert manager.num_handed_out_blocks == 3


@pytest.mark.parametrize("is_lazily_committed", [False, True])
def test_many_short_requests_hand_out_the_peak_in_use_on_a_lazy_pool(is_lazily_committed: bool) -> None:
    """200 requests of distinct tokens, four at a time, on a 1000-block pool: a lazily committed
    pool hands out (commits) only the peak of blocks in use; the committed order takes a fresh
    block for each new one and keeps the old ones cached."""
    manager = KVCacheManager(1000, 4, is_lazily_committed=is_lazily_committed)
    peak_used = 0
    for first in range(0, 200, 4):
        for seq_id in range(first, first + 4):
            _run(manager, seq_id, [seq_id * 16 + t for t in range(10)])  # 3 blocks, 2 of them full
        peak_used = max(peak_used, manager.num_used_blocks)
        for seq_id in range(first, first + 4):
            _free(manager, seq_id)
    assert peak_used == 12
    if is_lazily_committed:
        assert manager.num_handed_out_blocks == 12
        assert manager.stats().num_cached_blocks == 8  # the last four requests' full blocks
    else:
        assert manager.num_handed_out_blocks == 2 * 200 + 4  # full blocks kept; 4 partials reused
        assert manager.stats().num_cached_blocks == 400


def test_block_table_tuple_is_kept_until_the_table_grows_and_dropped_on_free() -> None:
    manager = _manager()
    assert manager.allocate(1, 3)
    first = manager.block_table(1)
    assert first == (0,)
    assert manager.allocate(1, 4)  # still one block: the same tuple comes back
    assert manager.block_table(1) is first
    assert manager.allocate(1, 5)  # grows: a new tuple; the old one is unchanged
    assert manager.block_table(1) == (0, 1)
    assert first == (0,)
    manager.check_invariants()
    _free(manager, 1)
    assert manager.allocate(2, 5)  # takes the two blocks seq 1 freed
    assert manager.block_table(2) == (0, 1)
    assert manager.allocate(1, 5)  # the same seq_id and length again: its new table
    assert manager.block_table(1) == (2, 3)
    manager.check_invariants()


def test_cache_blocks_without_a_new_full_block_still_checks_its_arguments() -> None:
    manager = _manager()
    assert _run(manager, 1, A + TAIL) == (0, 1)
    with pytest.raises(ValueError, match="outside"):
        manager.cache_blocks(1, A, 6)  # fewer tokens than num_tokens
    with pytest.raises(KeyError):
        manager.cache_blocks(7, A + TAIL, 6)


def _state(manager: KVCacheManager) -> tuple[object, ...]:
    tables = {s: manager.block_table(s) for s in sorted(manager._block_tables)}  # white-box read
    cached = [b for b in range(manager.num_blocks) if _is_cached(manager, b)]
    return tables, _refs(manager), _free_order(manager), cached, dict(manager._num_cached_blocks)


def test_allocate_running_is_allocate_in_order_up_to_the_first_that_does_not_fit() -> None:
    batched, single = _manager(), _manager()
    for m in (batched, single):
        for seq_id, tokens in ((0, A + B), (1, C), (2, D + TAIL)):
            assert m.allocate(seq_id, len(tokens))
    # seq 0 grows by a block, seq 1 stays covered, seq 2 grows by three: 4 of the 5 free blocks;
    # then seq 1 asks for 3 more and does not fit: the call stops there, seq 0 is not retried.
    want = [(0, 9), (1, 4), (2, 17), (1, 16), (0, 40)]
    assert batched.allocate_running([s for s, _ in want], [n for _, n in want]) == 3
    for seq_id, n in want[:4]:
        if not single.allocate(seq_id, n):
            break
    assert _state(batched) == _state(single)
    assert batched.block_table(0) == (0, 1, 5) and batched.block_table(2) == (3, 4, 6, 7, 8)
    assert batched.allocate_running([0, 1], [12, 4]) == 2  # all covered: nothing taken
    assert batched.num_free_blocks == 1
    batched.check_invariants()


def test_running_batches_check_their_arguments() -> None:
    manager = _manager()
    manager.allocate(0, 4)
    with pytest.raises(KeyError):
        manager.allocate_running([0, 7], [4, 4])
    with pytest.raises(ValueError):
        manager.allocate_running([0], [4, 4])
    with pytest.raises(ValueError):
        manager.allocate_running([0], [-1])
    with pytest.raises(ValueError):
        manager.cache_running_blocks([0], [A], [4, 4])
    with pytest.raises(ValueError):
        manager.cache_running_blocks([0], [A], [5])  # more tokens than given
    with pytest.raises(KeyError):
        manager.block_tables([0, 7])


def test_cache_running_blocks_and_block_tables_equal_the_single_calls() -> None:
    batched, single = _manager(), _manager()
    seqs = {0: A + B + TAIL, 1: A + C, 2: A + B + D}  # 1 and 2 share A (and 2 shares B with 0)
    for m in (batched, single):
        for seq_id, tokens in seqs.items():
            m.allocate(seq_id, len(tokens))
    counts = [(0, 9), (1, 7), (2, 12)]  # seq 1's second block is not full yet
    batched.cache_running_blocks([s for s, _ in counts], [seqs[s] for s, _ in counts], [n for _, n in counts])
    for seq_id, n in counts:
        single.cache_blocks(seq_id, seqs[seq_id], n)
    assert _state(batched) == _state(single)
    # A and B of seqs 1 and 2 sit on other blocks than seq 0's: uncached there, retried later.
    assert batched._num_cached_blocks == {0: 2, 1: 0, 2: 0}
    assert batched.block_tables([2, 0]) == (batched.block_table(2), batched.block_table(0))
    assert batched.block_tables([]) == ()
    batched.check_invariants()
