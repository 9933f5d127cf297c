"""KV cache manager: the one object the scheduler talks to about KV blocks.

Owns the block tables (``seq_id -> block ids``, append-only while a sequence runs) and, per
sequence, how many leading blocks of its table are known to be cached as its chain. Coordinates a
``BlockPool`` (ref counts, LRU free queue) and a ``RadixCache`` (which blocks hold which tokens)::

    block table of a sequence:  | hit blocks (shared, from cache) | own blocks ... | partial |
                                  ^ table[:num_cached] form a chain in the tree

A prompt that goes on past its cached full blocks may share the first tokens of the next block
with a cached one (a common system prompt that ends inside a block, a prompt contained in an
earlier one): ``match_partial`` names that block and how many of its tokens, and the scheduler
has the runner copy it into the prompt's own block (``BlockCopy``) instead of computing those
tokens. The copy runs before the step's forward pass, so its source must already hold its KV:
blocks cached since the last ``mark_written`` (their KV is written by the coming forward pass)
are never a source.

Cached blocks that no table references stay in the tree and sit in the pool's free queue; they
are evicted from the tree only when ``pop_free`` hands them out again, least recently used first.
In a pool committed up front that happens once no never-used block is left; in a lazily
committed one (``is_lazily_committed``, a CPU pool) before any never-used block is taken, so the
blocks ever written number the peak of blocks in use, and cached blocks live in what that peak
leaves free.

Invariants (``check_invariants``):
- the pool's and the cache's own invariants hold;
- each block's ref count equals the number of tables holding it; no table holds a block twice;
- a cached block at ``table[i]`` has ``table[i-1]`` as its tree parent (the root when i == 0), so a
  referenced cached block's cached ancestors are referenced as well;
- in the free queue every cached block comes before its cached ancestors (so the LRU head, when
  cached, is a leaf);
- with prefix caching off, nothing is cached.

May import: the standard library and this package only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .block_pool import BlockPool
from .radix_cache import CacheMatch, CacheStats, PartialMatch, RadixCache

__all__ = ["BlockCopy", "ForkResult", "KVCacheManager"]

_EMPTY_MATCH = CacheMatch()


@dataclass(frozen=True, slots=True)
class BlockCopy:
    """The runner must copy the KV of block ``src`` into block ``dst``."""

    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class ForkResult:
    """Outcome of ``KVCacheManager.fork``; ``copy`` is None when nothing needs copying."""

    copy: BlockCopy | None


def _no_table(seq_id: object) -> KeyError:
    return KeyError(f"seq_id {seq_id} has no block table")


class KVCacheManager:
    """Block tables over a ``BlockPool`` with an optional radix prefix cache."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        hash_seed: int = 0,
        is_lazily_committed: bool = False,
    ) -> None:
        """``is_lazily_committed``: the KV memory behind the blocks is committed as a block is
        first written (see ``BlockPool``); reuse written blocks, evicting cached ones, before
        taking a never-used one."""
        self._pool = BlockPool(num_blocks, block_size, is_lazily_committed=is_lazily_committed)
        self._cache = RadixCache(block_size, hash_seed)
        self._enable_prefix_caching = enable_prefix_caching
        self._block_size = block_size
        self._block_tables: dict[int, list[int]] = {}
        # Each table as a tuple, made again whenever the table grows: a running sequence's table
        # is handed out every step and grows once per block_size tokens.
        self._table_tuples: dict[int, tuple[int, ...]] = {}
        # Leading blocks of each table known to be cached as that table's chain.
        self._num_cached_blocks: dict[int, int] = {}
        # Blocks cached since the last `mark_written`: the coming forward pass writes their KV.
        self._unwritten: set[int] = set()

    @property
    def block_size(self) -> int:
        return self._pool.block_size

    @property
    def num_blocks(self) -> int:
        return self._pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Unreferenced blocks, including cached ones (they are evictable)."""
        return self._pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self._pool.num_used_blocks

    @property
    def num_handed_out_blocks(self) -> int:
        """Blocks handed out at least once since construction (their KV may be committed)."""
        return self._pool.num_handed_out_blocks

    @property
    def enable_prefix_caching(self) -> bool:
        return self._enable_prefix_caching

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks covering ``num_tokens`` token slots; ValueError when negative."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return -(-num_tokens // self._pool.block_size)

    def has_table(self, seq_id: int) -> bool:
        return seq_id in self._block_tables

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """Block ids of ``seq_id``, in token order; KeyError when it has no table."""
        frozen = self._table_tuples.get(seq_id)
        if frozen is None:
            raise _no_table(seq_id)
        return frozen

    def _table(self, seq_id: int) -> list[int]:
        table = self._block_tables.get(seq_id)
        if table is None:
            raise _no_table(seq_id)
        return table

    def match_prefix(self, token_ids: Sequence[int]) -> CacheMatch:
        """Longest cached chain of full blocks of ``token_ids``; reads the tree only.

        Pass only the tokens you are willing to take from cache (the scheduler leaves out the
        last prompt token so that at least one token is computed). Empty when caching is off.
        """
        if not self._enable_prefix_caching:
            return _EMPTY_MATCH
        return self._cache.match(token_ids)

    def match_partial(self, hit: CacheMatch, token_ids: Sequence[int]) -> PartialMatch | None:
        """A cached block holding the first tokens of ``token_ids`` after ``hit``'s full blocks
        (``hit``: ``match_prefix`` of the same tokens, just before), the most of them that any
        block at that position holds; None when none does, or caching is off. Its KV already
        written (not cached since the last ``mark_written``). Pass the same tokens as to
        ``match_prefix``: at least one token after the ones matched must stay to be computed,
        and the result's ``num_tokens`` is at most ``len(token_ids) - hit.num_tokens``. The
        caller allocates the prompt's table past them and copies the block into its first own
        block (``BlockCopy``) before the next forward pass; nothing here changes.
        """
        if not self._enable_prefix_caching:
            return None
        parent = hit.block_ids[-1] if hit.block_ids else None
        return self._cache.match_partial(parent, token_ids[hit.num_tokens :], exclude=self._unwritten)

    def mark_written(self) -> None:
        """Every block cached so far holds its KV (a forward pass ran since they were cached):
        they may be ``match_partial``'s source from now on."""
        self._unwritten.clear()

    def _check_hit(self, hit: CacheMatch, num_tokens: int) -> None:
        """ValueError unless ``hit`` is, right now, a cached chain from the root."""
        if not hit.block_ids:
            if hit.num_tokens != 0:
                raise ValueError(f"empty hit with num_tokens={hit.num_tokens}")
            return
        if not self._enable_prefix_caching:
            raise ValueError("a non-empty hit was given but prefix caching is off")
        if hit.num_tokens != len(hit.block_ids) * self.block_size:
            raise ValueError(
                f"hit.num_tokens={hit.num_tokens} for {len(hit.block_ids)} blocks of "
                f"{self.block_size}"
            )
        if num_tokens < hit.num_tokens:
            raise ValueError(f"num_tokens={num_tokens} < hit.num_tokens={hit.num_tokens}")
        prev_block_id: int | None = None
        for block_id in hit.block_ids:
            if not self._cache.is_cached(block_id) or (
                self._cache.parent_block_id(block_id) != prev_block_id
            ):
                raise ValueError(
                    f"stale hit: block {block_id} is no longer cached at its position; call "
                    "match_prefix right before allocate"
                )
            prev_block_id = block_id

    def _num_free_blocks_consumed(
        self, seq_id: int, num_tokens: int, hit: CacheMatch | None
    ) -> int:
        """Free blocks ``allocate`` would take; validates the arguments (ValueError)."""
        num_blocks_needed = self.num_blocks_needed(num_tokens)
        table = self._block_tables.get(seq_id)
        if table is not None:
            if hit is not None:
                raise ValueError(f"seq_id {seq_id} already has a table; hit must be None")
            return max(0, num_blocks_needed - len(table))
        if hit is None:
            return num_blocks_needed
        self._check_hit(hit, num_tokens)
        # A hit block nobody references sits in the free queue; taking it uses up a free block.
        num_hit_free = sum(1 for b in hit.block_ids if self._pool.ref_count(b) == 0)
        return num_blocks_needed - len(hit.block_ids) + num_hit_free

    def can_allocate(self, seq_id: int, num_tokens: int, hit: CacheMatch | None = None) -> bool:
        """Whether ``allocate`` with the same arguments would succeed now; mutates nothing."""
        consumed = self._num_free_blocks_consumed(seq_id, num_tokens, hit)
        return consumed <= self._pool.num_free_blocks

    def allocate(self, seq_id: int, num_tokens: int, hit: CacheMatch | None = None) -> bool:
        """Make ``seq_id``'s table cover ``num_tokens`` token slots.

        First call for a sequence: the table starts with ``hit.block_ids`` (each gains a
        reference), then fresh blocks are appended. Later calls (``hit`` must be None) append
        fresh blocks; a table never shrinks. Returns False and changes nothing when the free
        blocks do not cover the need. Raises ValueError for a negative ``num_tokens``, a hit on
        a later call, or a hit that is inconsistent or stale (an allocation since the
        ``match_prefix`` that produced it evicted one of its blocks).
        """
        table = self._block_tables.get(seq_id)
        if table is not None and hit is None and 0 <= num_tokens <= len(table) * self._block_size:
            return True  # covered already: a running sequence's usual step
        consumed = self._num_free_blocks_consumed(seq_id, num_tokens, hit)
        if consumed > self._pool.num_free_blocks:
            return False
        if table is None:
            hit_block_ids = () if hit is None else hit.block_ids
            for block_id in hit_block_ids:  # before pop_free: a hit block may not be handed out
                self._pool.incref(block_id)
            table = list(hit_block_ids)
            self._block_tables[seq_id] = table
            self._num_cached_blocks[seq_id] = len(hit_block_ids)
        num_blocks_needed = self.num_blocks_needed(num_tokens)
        while len(table) < num_blocks_needed:
            table.append(self._pop_free_block())
        kept = self._table_tuples.get(seq_id)
        if kept is None or len(kept) != len(table):
            self._table_tuples[seq_id] = tuple(table)
        return True

    def allocate_running(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> int:
        """``allocate(seq_ids[i], num_tokens[i])`` for each sequence in order, stopping at the
        first that does not fit; returns how many were covered (``len(seq_ids)``: all). Each
        sequence must already have a table (KeyError otherwise): this is the scheduler's step
        over its running sequences, most of whose tables already cover the next token."""
        if len(seq_ids) != len(num_tokens):
            raise ValueError(f"{len(seq_ids)} seq_ids but {len(num_tokens)} token counts")
        kept, size = self._table_tuples, self._block_size
        try:
            short = [i for i, (seq_id, n) in enumerate(zip(seq_ids, num_tokens, strict=True))
                     if not 0 <= n <= len(kept[seq_id]) * size]
        except KeyError as exc:
            raise _no_table(exc.args[0]) from None
        for i in short:
            if not self.allocate(seq_ids[i], num_tokens[i]):
                return i
        return len(seq_ids)

    def _pop_free_block(self) -> int:
        """Take the LRU head of the free queue, evicting it from the tree when cached.

        A cached block at the head is always a leaf of the tree. Its cached descendants are
        unreferenced too (a table holding a cached block holds all of its ancestors, so a
        referenced descendant would make it referenced), and they entered the free queue before
        it: ``free`` releases a table tail first, and a block reaches ref count 0 only when the
        last table holding it is freed, by which time every descendant already has. So they are
        nearer the head and were popped, and evicted, before it.
        """
        block_id = self._pool.pop_free()
        if block_id is None:
            raise AssertionError("no free block although the need was checked")
        if self._cache.is_cached(block_id):
            try:
                self._cache.evict(block_id)
            except ValueError as exc:  # not a leaf
                raise AssertionError(f"free-queue head {block_id} is cached but not a leaf") from exc
        return block_id

    def cache_blocks(self, seq_id: int, token_ids: Sequence[int], num_tokens: int) -> None:
        """Insert the first ``num_tokens // block_size`` full blocks of ``seq_id`` into the tree.

        ``token_ids`` are the sequence's tokens (at least ``num_tokens`` of them) and must be
        what the blocks hold. Resumes after the blocks already known to be cached, so calling
        it every step costs only the new blocks. A position whose content is already cached in
        another block is not inserted (nor is anything after it). No-op when caching is off.
        Raises KeyError for an unknown ``seq_id``, ValueError when ``num_tokens`` exceeds the
        tokens given or the table.
        """
        num_full_blocks = num_tokens // self._block_size
        num_cached = self._num_cached_blocks.get(seq_id)
        if num_cached is not None and num_full_blocks <= num_cached and 0 <= num_tokens <= len(token_ids):
            return  # no new full block, none left to retry: a running sequence's usual step
        table = self._table(seq_id)
        if not 0 <= num_tokens <= len(token_ids):
            raise ValueError(f"num_tokens={num_tokens} outside [0, {len(token_ids)}]")
        if num_full_blocks > len(table):
            raise ValueError(
                f"num_tokens={num_tokens} needs {num_full_blocks} blocks; seq_id {seq_id} has "
                f"{len(table)}"
            )
        if not self._enable_prefix_caching:
            return
        num_cached = self._num_cached_blocks[seq_id]
        if num_full_blocks <= num_cached:
            return
        # token_ids may run past the full blocks: insert reads only the blocks it is given. The
        # chain reaches over the positions that now hold this table's own blocks; a position
        # taken by another block stays uncached and is retried on the next call (it may be
        # evicted).
        _, reach = self._cache.insert_chain(token_ids, table[:num_full_blocks], start_block_idx=num_cached)
        self._num_cached_blocks[seq_id] = reach
        self._unwritten.update(table[num_cached:reach])

    def cache_running_blocks(
        self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], num_tokens: Sequence[int]
    ) -> None:
        """``cache_blocks(seq_ids[i], token_ids[i], num_tokens[i])`` for each sequence in order
        (the same checks and errors); a sequence with no new full block costs a lookup."""
        if not len(seq_ids) == len(token_ids) == len(num_tokens):
            raise ValueError("seq_ids, token_ids and num_tokens differ in length")
        cached, size = self._num_cached_blocks, self._block_size
        todo = [i for i, (seq_id, tokens, n) in enumerate(zip(seq_ids, token_ids, num_tokens, strict=True))
                if n // size > cached.get(seq_id, -1) or not 0 <= n <= len(tokens)]
        for i in todo:
            self.cache_blocks(seq_ids[i], token_ids[i], num_tokens[i])

    def block_tables(self, seq_ids: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """``block_table`` of each sequence, in order (KeyError for one without a table)."""
        kept = self._table_tuples
        try:
            return tuple([kept[seq_id] for seq_id in seq_ids])
        except KeyError as exc:
            raise _no_table(exc.args[0]) from None

    def _is_chain_link(self, table: list[int], block_idx: int) -> bool:
        block_id = table[block_idx]
        if not self._cache.is_cached(block_id):
            return False
        expected_parent = table[block_idx - 1] if block_idx > 0 else None
        return self._cache.parent_block_id(block_id) == expected_parent

    def cached_chain_token_ids(self, block_id: int) -> tuple[int, ...] | None:
        """Every token from the root through the cached ``block_id`` (whose KV must be what
        those tokens produce), or None when the block is not cached; reads only."""
        if not self._cache.is_cached(block_id):
            return None
        chain: list[tuple[int, ...]] = []
        current: int | None = block_id
        while current is not None:
            chain.append(self._cache.block_token_ids(current))
            current = self._cache.parent_block_id(current)
        return tuple(t for block in reversed(chain) for t in block)

    def fork(self, parent_seq_id: int, child_seq_id: int, num_tokens: int) -> ForkResult | None:
        """Give ``child_seq_id`` the first ``num_tokens`` token slots of ``parent_seq_id``.

        Full blocks are shared (one more reference each). When ``num_tokens`` ends inside a
        block, that partial block is not shared: the child gets a fresh block and the result's
        ``copy`` tells the runner to copy the KV into it. Returns None and changes nothing when
        no block is free for that copy. Raises KeyError for an unknown parent, ValueError when
        the child already has a table or ``num_tokens`` is outside the parent's table.
        """
        parent_table = self._table(parent_seq_id)
        if child_seq_id in self._block_tables:
            raise ValueError(f"child seq_id {child_seq_id} already has a block table")
        if not 0 <= num_tokens <= len(parent_table) * self.block_size:
            raise ValueError(
                f"num_tokens={num_tokens} outside the parent's "
                f"{len(parent_table) * self.block_size} token slots"
            )
        num_full_blocks = num_tokens // self.block_size
        has_partial_block = num_tokens % self.block_size != 0
        if has_partial_block and self._pool.num_free_blocks == 0:
            return None
        child_table = parent_table[:num_full_blocks]
        for block_id in child_table:
            self._pool.incref(block_id)
        copy: BlockCopy | None = None
        if has_partial_block:
            dst = self._pop_free_block()
            copy = BlockCopy(src=parent_table[num_full_blocks], dst=dst)
            child_table.append(dst)
        self._block_tables[child_seq_id] = child_table
        self._table_tuples[child_seq_id] = tuple(child_table)
        self._num_cached_blocks[child_seq_id] = min(
            self._num_cached_blocks[parent_seq_id], num_full_blocks
        )
        return ForkResult(copy=copy)

    def free(self, seq_id: int) -> None:
        """Drop ``seq_id``'s table, releasing its blocks tail first; KeyError when unknown.

        Tail first, so that a shared prefix leaves last and a cached block enters the free
        queue after its cached descendants. Cached blocks go to the MRU tail of the free queue
        (kept for reuse), the others to the LRU head (reused first).
        """
        table = self._block_tables.pop(seq_id, None)
        if table is None:
            raise _no_table(seq_id)
        del self._num_cached_blocks[seq_id]
        self._table_tuples.pop(seq_id, None)
        for block_id in reversed(table):
            self._pool.decref(block_id, keep=self._cache.is_cached(block_id))

    def stats(self) -> CacheStats:
        """Prefix-cache counters (all zero when caching is off)."""
        return self._cache.stats()

    def check_invariants(self) -> None:
        """Raise AssertionError when tables, ref counts, tree and free queue disagree."""
        self._pool.check_invariants()
        self._cache.check_invariants()
        pool, cache = self._pool, self._cache
        if not self._enable_prefix_caching and cache.num_cached_blocks != 0:
            raise AssertionError("prefix caching is off but blocks are cached")
        if self._block_tables.keys() != self._num_cached_blocks.keys():
            raise AssertionError("block tables and cached-block counts track different seqs")
        if self._block_tables.keys() != self._table_tuples.keys():
            raise AssertionError("block tables and their tuples track different seqs")
        for seq_id, frozen in self._table_tuples.items():
            if list(frozen) != self._block_tables[seq_id]:
                raise AssertionError(f"seq_id {seq_id}: its table tuple {frozen} is not its table")
        num_tables_holding = [0] * pool.num_blocks
        for seq_id, table in self._block_tables.items():
            if len(set(table)) != len(table):
                raise AssertionError(f"seq_id {seq_id} holds a block twice: {table}")
            num_cached = self._num_cached_blocks[seq_id]
            if not 0 <= num_cached <= len(table):
                raise AssertionError(f"seq_id {seq_id}: num_cached {num_cached} out of range")
            for block_idx, block_id in enumerate(table):
                num_tables_holding[block_id] += 1
                is_link = self._is_chain_link(table, block_idx)
                if block_idx < num_cached and not is_link:
                    raise AssertionError(f"seq_id {seq_id}: block {block_id} is not cached")
                if cache.is_cached(block_id) and not is_link:
                    raise AssertionError(
                        f"seq_id {seq_id}: cached block {block_id} at {block_idx} does not "
                        "have the previous table entry as its parent"
                    )
        for block_id, count in enumerate(num_tables_holding):
            if pool.ref_count(block_id) != count:
                raise AssertionError(
                    f"block {block_id}: ref count {pool.ref_count(block_id)}, in {count} tables"
                )
        if pool.num_free_blocks + pool.num_used_blocks != pool.num_blocks:
            raise AssertionError("free + used != total")
        free_idx = {block_id: idx for idx, block_id in enumerate(pool.free_order())}
        for block_id in range(pool.num_blocks):
            if not cache.is_cached(block_id):
                continue
            parent_id = cache.parent_block_id(block_id)
            if block_id not in free_idx:
                continue  # referenced: its parent is referenced too (table check above)
            if parent_id in free_idx and free_idx[parent_id] < free_idx[block_id]:
                raise AssertionError(
                    f"cached block {parent_id} precedes its child {block_id} in the free queue"
                )
