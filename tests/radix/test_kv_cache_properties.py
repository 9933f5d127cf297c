"""Random operation runs of KVCacheManager against a shadow model of the KV it holds.

The shadow plays the model runner: it writes each computed token into the block and slot the
block table names, copies blocks on fork, and records which blocks the tree has cached with which
parent and tokens. After every operation:
- the manager's own invariants hold and free + used == total;
- every computed token of every sequence is found in its block (nobody overwrote a live block);
- the tree agrees with the shadow record: same cached blocks, parents and tokens, and a cached
  block holds the tokens the tree says (a cached block's tokens never change);
- only blocks unreferenced before the operation were evicted;
- match_prefix equals a naive walk over the shadow's cached blocks, and match_partial finds as
  many leading tokens past it as a naive scan of the cached blocks written before the last
  mark_written (the shadow copies the block it names and checks the copied slots like the rest);
- on a lazily committed pool, the blocks ever handed out number the peak of blocks in use.
At teardown every sequence is freed and every block must be free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from batchgen.radix import hashing
from batchgen.radix import radix_cache as radix_cache_module
from batchgen.radix.kv_cache_manager import BlockCopy, KVCacheManager
from batchgen.radix.radix_cache import CacheMatch, PartialMatch

_TOKEN = st.integers(0, 1)  # a tiny alphabet so that prefixes collide often


class _ManagerMachine(RuleBasedStateMachine):
    num_blocks = 10
    block_size = 2
    enable_prefix_caching = True
    is_lazily_committed = False

    def __init__(self) -> None:
        super().__init__()
        self.manager = KVCacheManager(
            self.num_blocks,
            self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            is_lazily_committed=self.is_lazily_committed,
        )
        self.peak_used = 0
        self.token_ids: dict[int, list[int]] = {}  # seq -> its tokens (computed and not yet)
        self.num_computed: dict[int, int] = {}
        self.kv: dict[int, list[int | None]] = {}  # block -> token in each slot (the "KV")
        self.cached: dict[int, tuple[int | None, tuple[int, ...]]] = {}  # block -> parent, tokens
        self.unwritten: set[int] = set()  # cached since the last mark_written
        self.next_seq_id = 0
        self.prev_refs = [0] * self.num_blocks
        self.prev_num_evictions = 0

    # -- helpers --------------------------------------------------------------------------
    def _refs(self) -> list[int]:
        return [self.manager._pool.ref_count(b) for b in range(self.num_blocks)]

    def _snapshot(self) -> tuple[object, ...]:
        tables = {s: self.manager.block_table(s) for s in self.token_ids}
        return (tables, self._refs(), self.manager._pool.free_order(), self.manager.stats())

    def _new_seq_id(self) -> int:
        self.next_seq_id += 1
        return self.next_seq_id

    def _write(
        self, seq_id: int, start: int, stop: int, num_old_blocks: int, copy: tuple[int, list[int | None]] | None = None
    ) -> None:
        """Runner: fresh blocks start empty, a partial hit's block is copied in (`copy`: the
        destination and the source's KV as it was before the allocation), then tokens
        [start, stop) are computed."""
        table = self.manager.block_table(seq_id)
        for block_id in table[num_old_blocks:]:
            self.kv[block_id] = [None] * self.block_size
        if copy is not None:
            self.kv[copy[0]] = list(copy[1])
        for pos in range(start, stop):
            self.kv[table[pos // self.block_size]][pos % self.block_size] = self.token_ids[seq_id][
                pos
            ]
        self.num_computed[seq_id] = stop

    def _naive_match(self, token_ids: Sequence[int]) -> CacheMatch:
        if not self.enable_prefix_caching:
            return CacheMatch()
        block_ids: list[int] = []
        parent: int | None = None
        for block_idx in range(len(token_ids) // self.block_size):
            block = tuple(
                token_ids[block_idx * self.block_size : (block_idx + 1) * self.block_size]
            )
            found = [b for b, (p, t) in self.cached.items() if p == parent and t == block]
            assert len(found) <= 1, found
            if not found:
                break
            block_ids.append(found[0])
            parent = found[0]
        return CacheMatch(tuple(block_ids), len(block_ids) * self.block_size)

    def _naive_partial(self, hit: CacheMatch, token_ids: Sequence[int]) -> int:
        """The most leading tokens of ``token_ids`` past ``hit`` that a written cached block at
        that position holds (fewer than a block)."""
        if not self.enable_prefix_caching:
            return 0
        parent = hit.block_ids[-1] if hit.block_ids else None
        tail = token_ids[hit.num_tokens :][: self.block_size - 1]
        best = 0
        for block_id, (block_parent, block_tokens) in self.cached.items():
            if block_parent != parent or block_id in self.unwritten:
                continue
            run = 0
            while run < len(tail) and block_tokens[run] == tail[run]:
                run += 1
            best = max(best, run)
        return best

    # -- rules ----------------------------------------------------------------------------
    @rule(data=st.data(), num_chunk_tokens=st.integers(1, 8))
    def add(self, data: st.DataObject, num_chunk_tokens: int) -> None:
        """Admit a new sequence: all-but-last-token cache hit, then a first chunk."""
        base: list[int] = []
        share = bool(self.token_ids) and data.draw(st.booleans(), label="share")
        if share:
            other = data.draw(st.sampled_from(sorted(self.token_ids)), label="other")
            base = self.token_ids[other][: data.draw(st.integers(0, 12), label="cut")]
        token_ids = base + data.draw(st.lists(_TOKEN, min_size=1, max_size=10), label="tail")
        hit = self.manager.match_prefix(token_ids[:-1])
        assert hit == self._naive_match(token_ids[:-1])
        partial: PartialMatch | None = None
        if data.draw(st.booleans(), label="partial"):
            partial = self.manager.match_partial(hit, token_ids[:-1])
            assert (0 if partial is None else partial.num_tokens) == self._naive_partial(hit, token_ids[:-1])
            if partial is not None:
                event("add: partial hit")
                assert self.cached[partial.block_id][0] == (hit.block_ids[-1] if hit.block_ids else None)
                assert partial.block_id not in self.unwritten
        num_cached = hit.num_tokens + (0 if partial is None else partial.num_tokens)
        num_tokens = min(len(token_ids), num_cached + num_chunk_tokens)
        source_kv = None if partial is None else list(self.kv[partial.block_id])
        seq_id = self._new_seq_id()
        before = self._snapshot()
        can = self.manager.can_allocate(seq_id, num_tokens, hit)
        assert self.manager.allocate(seq_id, num_tokens, hit) == can
        event("add: hit" if hit.block_ids else "add: miss")
        if not can:
            event("add: refused")
            assert self._snapshot() == before
            assert not self.manager.has_table(seq_id)
            return
        table = self.manager.block_table(seq_id)
        assert table[: len(hit.block_ids)] == hit.block_ids
        for block_idx, block_id in enumerate(hit.block_ids):  # the cache handed out our tokens
            start = block_idx * self.block_size
            assert self.kv[block_id] == token_ids[start : start + self.block_size]
        self._check_evictions()
        self.token_ids[seq_id] = token_ids
        copy = None if source_kv is None else (table[len(hit.block_ids)], source_kv)
        self._write(seq_id, num_cached, num_tokens, len(hit.block_ids), copy)
        if data.draw(st.booleans(), label="cache now"):
            self._cache_blocks(seq_id)

    @precondition(lambda self: bool(self.token_ids))
    @rule(data=st.data(), num_new_tokens=st.integers(1, 6))
    def grow(self, data: st.DataObject, num_new_tokens: int) -> None:
        """Compute more tokens of a sequence (prefill chunk or decode), extending it if needed."""
        seq_id = data.draw(st.sampled_from(sorted(self.token_ids)), label="seq")
        num_tokens = self.num_computed[seq_id] + num_new_tokens
        missing = num_tokens - len(self.token_ids[seq_id])
        new_token_ids = data.draw(
            st.lists(_TOKEN, min_size=max(0, missing), max_size=max(0, missing))
        )
        num_old_blocks = len(self.manager.block_table(seq_id))
        before = self._snapshot()
        can = self.manager.can_allocate(seq_id, num_tokens)
        assert self.manager.allocate(seq_id, num_tokens) == can
        if not can:
            event("grow: refused")
            assert self._snapshot() == before
            return
        self._check_evictions()
        self.token_ids[seq_id].extend(new_token_ids)
        self._write(seq_id, self.num_computed[seq_id], num_tokens, num_old_blocks)
        if data.draw(st.booleans(), label="cache now"):
            self._cache_blocks(seq_id)

    @precondition(lambda self: bool(self.token_ids))
    @rule(data=st.data())
    def cache(self, data: st.DataObject) -> None:
        self._cache_blocks(data.draw(st.sampled_from(sorted(self.token_ids)), label="seq"))

    def _cache_blocks(self, seq_id: int) -> None:
        """cache_blocks and record what became cached; inserting never evicts."""
        num_evictions = self.manager.stats().num_evictions
        token_ids, num_computed = self.token_ids[seq_id], self.num_computed[seq_id]
        self.manager.cache_blocks(seq_id, token_ids, num_computed)
        cache = self.manager._cache
        table = self.manager.block_table(seq_id)
        for block_idx in range(num_computed // self.block_size):
            block_id = table[block_idx]
            if cache.is_cached(block_id) and block_id not in self.cached:
                parent = table[block_idx - 1] if block_idx else None
                start = block_idx * self.block_size
                self.cached[block_id] = (parent, tuple(token_ids[start : start + self.block_size]))
                self.unwritten.add(block_id)
        assert self.manager.stats().num_evictions == num_evictions

    @rule()
    def mark_written(self) -> None:
        """A forward pass ran: every cached block may be a partial hit's source."""
        self.manager.mark_written()
        self.unwritten.clear()

    @precondition(lambda self: bool(self.token_ids))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent_id = data.draw(st.sampled_from(sorted(self.token_ids)), label="parent")
        num_tokens = data.draw(st.integers(0, self.num_computed[parent_id]), label="num_tokens")
        child_id = self._new_seq_id()
        has_partial = num_tokens % self.block_size != 0
        num_free = self.manager.num_free_blocks
        before = self._snapshot()
        result = self.manager.fork(parent_id, child_id, num_tokens)
        event("fork: refused" if result is None else f"fork: copy={result.copy is not None}")
        if result is None:
            assert has_partial and num_free == 0
            assert self._snapshot() == before
            return
        num_full = num_tokens // self.block_size
        parent_table = self.manager.block_table(parent_id)
        child_table = self.manager.block_table(child_id)
        assert child_table[:num_full] == parent_table[:num_full]
        if has_partial:
            assert result.copy == BlockCopy(src=parent_table[num_full], dst=child_table[num_full])
            self.kv[result.copy.dst] = list(self.kv[result.copy.src])  # runner copies the KV
        else:
            assert result.copy is None
            assert len(child_table) == num_full
        self.token_ids[child_id] = self.token_ids[parent_id][:num_tokens]
        self.num_computed[child_id] = num_tokens

    @precondition(lambda self: bool(self.token_ids))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.token_ids)), label="seq")
        self.manager.free(seq_id)
        del self.token_ids[seq_id], self.num_computed[seq_id]

    # -- checks ---------------------------------------------------------------------------
    def _check_evictions(self) -> None:
        """Blocks gone from the tree since the last check were unreferenced before this rule
        (``prev_refs``) and each was counted. Called right after allocating, before caching."""
        evicted = [b for b in self.cached if not self.manager._cache.is_cached(b)]
        for block_id in evicted:
            assert self.prev_refs[block_id] == 0, f"referenced block {block_id} was evicted"
            del self.cached[block_id]
            self.unwritten.discard(block_id)
        if evicted:
            event("evicted")
        num_evictions = self.manager.stats().num_evictions
        assert num_evictions - self.prev_num_evictions == len(evicted)
        self.prev_num_evictions = num_evictions

    @invariant()
    def consistent(self) -> None:
        manager, cache = self.manager, self.manager._cache
        manager.check_invariants()
        assert manager.num_free_blocks + manager.num_used_blocks == self.num_blocks
        self._check_evictions()
        # The tree holds exactly the shadow's cached blocks, with unchanged parents and tokens,
        # and each of them really holds those tokens.
        assert cache.num_cached_blocks == len(self.cached)
        for block_id, (parent, block_token_ids) in self.cached.items():
            assert cache.parent_block_id(block_id) == parent
            assert cache.block_token_ids(block_id) == block_token_ids
            assert tuple(self.kv[block_id]) == block_token_ids
        # Every computed token is still in its slot.
        for seq_id, token_ids in self.token_ids.items():
            table = manager.block_table(seq_id)
            assert len(table) >= manager.num_blocks_needed(self.num_computed[seq_id])
            for pos in range(self.num_computed[seq_id]):
                slot = self.kv[table[pos // self.block_size]][pos % self.block_size]
                assert slot == token_ids[pos], (seq_id, pos)
            assert manager.match_prefix(token_ids) == self._naive_match(token_ids)
        self.prev_refs = self._refs()
        self.peak_used = max(self.peak_used, manager.num_used_blocks)
        if self.is_lazily_committed:
            # a never-used block is taken only when every block used before is in use again
            assert manager.num_handed_out_blocks == self.peak_used

    def teardown(self) -> None:
        for seq_id in sorted(self.token_ids):
            self.manager.free(seq_id)
            self.manager.check_invariants()
        assert self.manager.num_free_blocks == self.num_blocks
        assert self.manager.num_used_blocks == 0
        assert self._refs() == [0] * self.num_blocks


class _BlocksOfFour(_ManagerMachine):
    num_blocks = 12
    block_size = 4


class _CachingOff(_ManagerMachine):
    enable_prefix_caching = False


class _LazilyCommitted(_ManagerMachine):
    is_lazily_committed = True


_SETTINGS = settings(max_examples=200, stateful_step_count=30, deadline=None)


def test_random_runs_block_size_2() -> None:
    run_state_machine_as_test(_ManagerMachine, settings=_SETTINGS)


def test_random_runs_block_size_4() -> None:
    run_state_machine_as_test(_BlocksOfFour, settings=settings(_SETTINGS, max_examples=100))


def test_random_runs_prefix_caching_off() -> None:
    run_state_machine_as_test(_CachingOff, settings=settings(_SETTINGS, max_examples=50))


def test_random_runs_lazily_committed() -> None:
    run_state_machine_as_test(_LazilyCommitted, settings=settings(_SETTINGS, max_examples=100))


def test_random_runs_with_colliding_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    real_hasher = hashing.block_hasher

    def colliding_hasher(block_size: int, seed: int = 0) -> Callable[[int, Sequence[int], int], int]:
        hasher = real_hasher(block_size, seed)

        def colliding_hash(parent_hash: int, token_ids: Sequence[int], extra_key: int = 0) -> int:
            return hasher(parent_hash, token_ids, extra_key) % 3

        return colliding_hash

    monkeypatch.setattr(radix_cache_module, "block_hasher", colliding_hasher)
    run_state_machine_as_test(_ManagerMachine, settings=settings(_SETTINGS, max_examples=100))
