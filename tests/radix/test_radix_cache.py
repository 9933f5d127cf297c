"""RadixCache: exact block ids from match/insert/evict on blocks of four tokens."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.radix import radix_cache as radix_cache_module
from batchgen.radix.hashing import hash_blocks
from batchgen.radix.radix_cache import CacheMatch, CacheStats, PartialMatch, RadixCache

A = [1, 2, 3, 4]
B = [5, 6, 7, 8]
C = [9, 10, 11, 12]
D = [13, 14, 15, 16]


def _cache() -> RadixCache:
    cache = RadixCache(4)
    cache.check_invariants()
    return cache


def _insert(cache: RadixCache, token_ids: Sequence[int], block_ids: Sequence[int]) -> int:
    num_inserted = cache.insert(token_ids, block_ids)
    cache.check_invariants()
    return num_inserted


def test_empty_cache_matches_nothing_and_counts_the_lookup() -> None:
    cache = _cache()
    assert cache.match(A + B) == CacheMatch(block_ids=(), num_tokens=0)
    assert cache.match([]) == CacheMatch()
    assert cache.stats() == CacheStats(num_lookups=2)


@pytest.mark.parametrize(("block_size", "hash_seed"), [(0, 0), (4, -1), (4, 2**64)])
def test_rejects_bad_arguments(block_size: int, hash_seed: int) -> None:
    with pytest.raises(ValueError):
        RadixCache(block_size, hash_seed)


def test_insert_then_match_longest_chain() -> None:
    cache = _cache()
    assert _insert(cache, A + B + C, [7, 3, 5]) == 3
    assert cache.num_cached_blocks == 3
    assert cache.match(A + B + C + D) == CacheMatch(block_ids=(7, 3, 5), num_tokens=12)
    assert cache.match(A + B + D) == CacheMatch(block_ids=(7, 3), num_tokens=8)
    assert cache.match(B + C) == CacheMatch()
    assert cache.stats() == CacheStats(num_lookups=3, num_hit_tokens=20, num_cached_blocks=3)
    assert cache.parent_block_id(7) is None
    assert cache.parent_block_id(5) == 3
    assert cache.block_token_ids(3) == tuple(B)
    assert [cache.is_leaf(b) for b in (7, 3, 5)] == [False, False, True]


def test_partial_block_tokens_are_never_matched() -> None:
    cache = _cache()
    _insert(cache, A + B, [0, 1])
    # Three tokens of B: only the full block A can match.
    assert cache.match(A + B[:3]) == CacheMatch(block_ids=(0,), num_tokens=4)
    assert cache.match(A[:3]) == CacheMatch()


def test_insert_requires_tokens_for_every_block() -> None:
    cache = _cache()
    with pytest.raises(ValueError, match="fewer than"):
        cache.insert(A + B[:3], [0, 1])
    assert cache.num_cached_blocks == 0
    # Extra tokens (a partial tail) are fine and ignored.
    assert _insert(cache, A + B[:3], [0]) == 1


def test_reinsert_same_chain_skips_and_extends() -> None:
    cache = _cache()
    assert _insert(cache, A + B, [0, 1]) == 2
    assert _insert(cache, A + B, [0, 1]) == 0
    assert _insert(cache, A + B + C, [0, 1, 2]) == 1
    assert cache.match(A + B + C) == CacheMatch(block_ids=(0, 1, 2), num_tokens=12)


def test_branching_chains_share_the_prefix_node() -> None:
    cache = _cache()
    _insert(cache, A + B, [0, 1])
    assert _insert(cache, A + C, [0, 2]) == 1
    assert cache.parent_block_id(2) == 0
    assert cache.match(A + C) == CacheMatch(block_ids=(0, 2), num_tokens=8)
    assert cache.match(A + B) == CacheMatch(block_ids=(0, 1), num_tokens=8)


def test_duplicate_content_insert_stops_at_the_conflict() -> None:
    cache = _cache()
    _insert(cache, A + B, [0, 1])
    # Another sequence computed A + B + C in blocks 4, 5, 6: A is cached in block 0, so nothing
    # of it is inserted (block 5 or 6 under block 4 would break the chain rule).
    assert _insert(cache, A + B + C, [4, 5, 6]) == 0
    assert [cache.is_cached(b) for b in (4, 5, 6)] == [False, False, False]
    # Same prefix block, different block for B: stops at B, C is not inserted either.
    assert _insert(cache, A + B + C, [0, 5, 6]) == 0
    assert cache.num_cached_blocks == 2


def test_block_id_cached_elsewhere_raises() -> None:
    cache = _cache()
    _insert(cache, A + B, [0, 1])
    with pytest.raises(ValueError, match="block 1 is already cached"):
        cache.insert(C, [1])
    with pytest.raises(ValueError, match="block 3 is already cached"):
        cache.insert(C + D, [3, 3])
    cache.check_invariants()


def test_extra_key_separates_chains() -> None:
    cache = _cache()
    cache.insert(A, [0], extra_key=1)
    assert cache.match(A) == CacheMatch()
    assert cache.match(A, extra_key=1) == CacheMatch(block_ids=(0,), num_tokens=4)
    assert cache.insert(A, [1], extra_key=2) == 1
    cache.check_invariants()


def test_collision_never_returns_blocks_with_other_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def constant_hash(
        parent_hash: int, token_ids: Sequence[int], extra_key: int = 0, seed: int = 0
    ) -> int:
        return 42

    monkeypatch.setattr(radix_cache_module, "block_hasher", lambda block_size, seed=0: constant_hash)
    cache = _cache()
    assert _insert(cache, A + B, [0, 1]) == 2
    assert cache.match(A + B) == CacheMatch(block_ids=(0, 1), num_tokens=8)
    # Every block hashes alike: only token-equal blocks may come back.
    assert cache.match(A + C) == CacheMatch(block_ids=(0,), num_tokens=4)
    assert cache.match(C + B) == CacheMatch()
    assert cache.match(B) == CacheMatch()
    # A colliding insert is treated as an occupied position: nothing inserted, nothing changed.
    assert _insert(cache, C, [2]) == 0
    assert _insert(cache, A + C, [0, 2]) == 0
    assert cache.block_token_ids(1) == tuple(B)
    assert cache.match(A + C) == CacheMatch(block_ids=(0,), num_tokens=4)


def test_same_block_id_with_other_tokens_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(radix_cache_module, "block_hasher", lambda block_size, seed=0: lambda *args: 42)
    cache = _cache()
    _insert(cache, A, [0])
    with pytest.raises(ValueError, match="other tokens"):
        cache.insert(B, [0])


def test_insert_resumes_at_start_block_idx() -> None:
    cache = _cache()
    _insert(cache, A + B, [0, 1])
    assert cache.insert(A + B + C + D, [0, 1, 2, 3], start_block_idx=2) == 2
    cache.check_invariants()
    assert cache.match(A + B + C + D) == CacheMatch(block_ids=(0, 1, 2, 3), num_tokens=16)
    assert cache.insert(A + B + C + D, [0, 1, 2, 3], start_block_idx=4) == 0


@pytest.mark.parametrize(
    ("token_ids", "block_ids", "start_block_idx"),
    [
        (A + B + C, [0, 9, 2], 2),  # block 9 is not cached
        (A + C + C, [0, 1, 2], 2),  # block 1 holds B, not C
        (A + B + C, [1, 0, 2], 1),  # block 1 is cached at position 1, not 0
        (A + B, [0, 1], 3),  # past the end
    ],
)
def test_insert_rejects_a_wrong_resume_point(
    token_ids: list[int], block_ids: list[int], start_block_idx: int
) -> None:
    cache = _cache()
    _insert(cache, A + B, [0, 1])
    with pytest.raises(ValueError, match="start_block_idx"):
        cache.insert(token_ids, block_ids, start_block_idx=start_block_idx)
    assert cache.num_cached_blocks == 2


def test_evict_leaves_only() -> None:
    cache = _cache()
    _insert(cache, A + B, [0, 1])
    _insert(cache, A + C, [0, 2])
    with pytest.raises(ValueError, match="not a leaf"):
        cache.evict(0)
    with pytest.raises(ValueError, match="not cached"):
        cache.evict(5)
    cache.evict(1)
    cache.check_invariants()
    assert (cache.is_cached(1), cache.is_leaf(0)) == (False, False)
    assert cache.match(A + B) == CacheMatch(block_ids=(0,), num_tokens=4)
    cache.evict(2)
    assert cache.is_leaf(0)
    cache.evict(0)
    cache.check_invariants()
    assert cache.stats() == CacheStats(num_lookups=1, num_hit_tokens=4, num_evictions=3)
    # The freed ids can be cached again, at other positions.
    assert _insert(cache, D + A, [2, 0]) == 2


def test_match_partial_finds_the_longest_leading_run_under_the_chain() -> None:
    cache = _cache()
    _insert(cache, [*A, 5, 6, 70, 80], [0, 1])  # under A: 5 6 70 80
    _insert(cache, [*A, 5, 60, 7, 8], [0, 2])  # under A: 5 60 7 8
    _insert(cache, [5, 6, 7, 8], [3])  # under the root: same tokens, another position
    # after A, the prompt goes on 5 6 7: block 1 holds its first two tokens, block 2 one
    assert cache.match_partial(0, [5, 6, 7, 9, 9]) == PartialMatch(block_id=1, num_tokens=2)
    assert cache.match_partial(0, [5, 60]) == PartialMatch(block_id=2, num_tokens=2)
    assert cache.match_partial(0, [5]) in (PartialMatch(1, 1), PartialMatch(2, 1))
    # only the position under the chain counts: block 3 holds 5 6 7 8 at position 0
    assert cache.match_partial(None, [5, 6, 7]) == PartialMatch(block_id=3, num_tokens=3)
    assert cache.match_partial(None, [1, 2, 3, 9]) == PartialMatch(block_id=0, num_tokens=3)
    assert cache.match_partial(0, [9, 6, 7]) is None  # no child shares the first token
    assert cache.match_partial(0, []) is None
    # at most block_size - 1 tokens: a whole block is match's, not a partial hit
    assert cache.match_partial(None, [5, 6, 7, 8, 9]) == PartialMatch(block_id=3, num_tokens=3)
    assert cache.stats().num_partial_hit_tokens == 2 + 2 + 1 + 3 + 3 + 3
    with pytest.raises(ValueError, match="not cached"):
        cache.match_partial(9, [5])


def test_match_partial_leaves_out_excluded_blocks_and_other_keys() -> None:
    cache = _cache()
    _insert(cache, [5, 6, 7, 1], [1])
    _insert(cache, [5, 6, 7, 2], [2])
    _insert(cache, [5, 6, 8, 8], [3])
    _insert(cache, [5, 9, 9, 9], [4])
    assert cache.match_partial(None, [5, 6, 7]).num_tokens == 3  # type: ignore[union-attr]
    assert cache.match_partial(None, [5, 6, 7], exclude={1}) == PartialMatch(2, 3)
    assert cache.match_partial(None, [5, 6, 7], exclude={1, 2}) == PartialMatch(3, 2)
    assert cache.match_partial(None, [5, 6, 7], exclude={1, 2, 3}) == PartialMatch(4, 1)
    assert cache.match_partial(None, [5, 6, 7], exclude={1, 2, 3, 4}) is None
    assert cache.match_partial(None, [5, 6, 7], extra_key=1) is None
    cache.insert([5, 6, 7, 3], [5], extra_key=1)
    cache.check_invariants()
    assert cache.match_partial(None, [5, 6, 9], extra_key=1) == PartialMatch(5, 2)
    # an evicted block is gone from its parent's sorted children
    cache.evict(1)
    cache.evict(2)
    cache.check_invariants()
    assert cache.match_partial(None, [5, 6, 7]) == PartialMatch(3, 2)


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 2), min_size=4, max_size=4)), max_size=12),
    prompt=st.lists(st.integers(0, 2), max_size=6),
    excluded=st.sets(st.integers(0, 11)),
)
def test_match_partial_agrees_with_a_scan_of_the_children(
    blocks: list[tuple[int, list[int]]], prompt: list[int], excluded: set[int]
) -> None:
    """Root children with a tiny alphabet and three extra keys: the run found is the longest
    that any non-excluded child of the same key shares, and the block named has it."""
    cache = _cache()
    for block_id, (key, tokens) in enumerate(blocks):
        cache.insert(tokens, [block_id], extra_key=key)
    cache.check_invariants()
    for key in range(3):
        found = cache.match_partial(None, prompt, extra_key=key, exclude=excluded)

        def run(tokens: Sequence[int]) -> int:
            n = 0
            while n < min(len(prompt), 3) and tokens[n] == prompt[n]:
                n += 1
            return n

        children = [
            (block_id, cache.block_token_ids(block_id))
            for block_id, (k, _) in enumerate(blocks)
            if k == key and cache.is_cached(block_id) and block_id not in excluded
        ]
        best = max((run(tokens) for _, tokens in children), default=0)
        if best == 0:
            assert found is None
        else:
            assert found is not None and found.num_tokens == best
            assert found.block_id not in excluded and run(cache.block_token_ids(found.block_id)) == best


def test_queries_on_uncached_block_raise() -> None:
    cache = _cache()
    assert not cache.is_cached(0)
    for query in (cache.is_leaf, cache.parent_block_id, cache.block_token_ids):
        with pytest.raises(ValueError, match="not cached"):
            query(0)


def test_hashes_agree_with_hash_blocks() -> None:
    cache = RadixCache(4, hash_seed=99)
    cache.insert(A + B + C, [0, 1, 2])
    nodes = [cache._nodes_by_block_id[b] for b in (0, 1, 2)]  # white-box
    assert [n.block_hash for n in nodes] == hash_blocks(A + B + C, 4, seed=99)


def test_check_invariants_detects_corruption() -> None:
    cache = _cache()
    _insert(cache, A + B, [0, 1])
    cache._nodes_by_block_id[1].token_ids = tuple(C)  # white-box: content changed
    with pytest.raises(AssertionError, match="block 1"):
        cache.check_invariants()


def test_deep_chain_has_no_recursion_limit() -> None:
    cache = RadixCache(1)
    tokens = list(range(5000))
    assert cache.insert(tokens, list(range(5000))) == 5000
    cache.check_invariants()
    assert cache.match(tokens).num_tokens == 5000


def test_insert_chain_reaches_up_to_a_position_held_by_another_block() -> None:
    cache = _cache()
    assert cache.insert_chain(A + B, [0, 1]) == (2, 2)
    # Position 1 holds block 1: a chain [0, 5, 6] reaches only position 0.
    assert cache.insert_chain(A + B + C, [0, 5, 6]) == (0, 1)
    assert not cache.is_cached(5) and not cache.is_cached(6)
    # The same chain grown by a block: one inserted, all three reached.
    assert cache.insert_chain(A + B + C, [0, 1, 2], start_block_idx=1) == (1, 3)
    assert cache.insert(A + B + C, [0, 1, 2]) == 0
    cache.check_invariants()


def test_block_index_is_a_list_over_any_ids() -> None:
    # The index is a list indexed by block id: ids far apart, a negative id asked about, and an
    # evicted id inserted again must behave as they did with a dict.
    cache = _cache()
    _insert(cache, A + B, [900, 3])
    assert cache.is_cached(900) and cache.is_cached(3)
    assert not cache.is_cached(-1) and not cache.is_cached(4) and not cache.is_cached(10**6)
    with pytest.raises(ValueError, match="not cached"):
        cache.parent_block_id(-900)
    assert cache.parent_block_id(3) == 900
    assert cache.num_cached_blocks == 2
    cache.evict(3)
    assert not cache.is_cached(3) and cache.num_cached_blocks == 1
    _insert(cache, A + C, [900, 3])
    assert cache.parent_block_id(3) == 900 and cache.num_cached_blocks == 2
    cache.check_invariants()
    with pytest.raises(ValueError, match=">= 0"):
        cache.insert(C + A, [-2, 5])
    assert not cache.is_cached(5) and cache.num_cached_blocks == 2
    cache.check_invariants()


def test_check_invariants_detects_a_wrong_count() -> None:
    cache = _cache()
    _insert(cache, A + B, [0, 1])
    cache._num_cached_blocks = 3  # white-box
    with pytest.raises(AssertionError, match="counter says 3"):
        cache.check_invariants()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(-3, 3), st.integers(-5, 5000)), max_size=40))
def test_block_index_agrees_with_a_dict_model(ops: list[tuple[bool, int, int]]) -> None:
    # Random inserts of one-block chains (tokens chosen by `t`) under any block id, negative and
    # sparse ones included, and evictions of any id, against a dict of what should be cached.
    cache = RadixCache(4)
    model: dict[int, tuple[int, ...]] = {}  # block id -> its tokens
    for is_insert, t, block_id in ops:
        tokens = (t, t + 1, t + 2, t + 3)
        if is_insert:
            held = next((b for b, toks in model.items() if toks == tokens), None)
            if held is not None:  # the content is cached (under this id or another): nothing new
                assert cache.insert(tokens, [block_id]) == 0
            elif block_id < 0 or block_id in model:  # a new node under a bad or taken id
                with pytest.raises(ValueError):
                    cache.insert(tokens, [block_id])
            else:
                assert cache.insert(tokens, [block_id]) == 1
                model[block_id] = tokens
        elif block_id in model:
            cache.evict(block_id)
            del model[block_id]
        else:
            with pytest.raises(ValueError, match="not cached"):
                cache.evict(block_id)
        cache.check_invariants()
        assert cache.num_cached_blocks == len(model)
        for b in (*model, block_id, -1, 0, 4999, 10**9):
            assert cache.is_cached(b) == (b in model)
        for b, toks in model.items():
            assert cache.block_token_ids(b) == toks and cache.parent_block_id(b) is None
