"""The radix prefix cache: a tree over hashed full KV blocks.

Owns the tree (hash chain -> cached block) and its counters. Each node is one full block::

    root ─► node(block 3: tokens 0..bs-1) ─► node(block 7: tokens bs..2bs-1) ─► ...
                                          └► node(block 9: other tokens bs..2bs-1)

A node stores its hash, block id, position in the chain (``block_idx``), the block's tokens,
its extra key, its parent (None under the root) and its children keyed by hash (a plain dict:
lookups never create nodes). Each parent (the root too) also keeps its children sorted by
(extra key, tokens), so that ``match_partial`` finds the child sharing the longest run of leading
tokens with a prompt in a binary search: in sorted order that child is a neighbour of the
prompt's place. An index maps block id -> node: a list indexed by block id (ids are
a pool's ``0..num_blocks-1``; it grows to the largest id inserted), None where nothing is cached,
so that the checks that run for every block a sequence fills or frees index a list instead of
hashing into a dict.

Invariants (``check_invariants``):
- parent/child links agree and each child sits under the key of its own hash;
- each hash recomputes from (parent hash or ``ROOT_HASH``, tokens, extra key, seed);
- each node holds exactly ``block_size`` tokens and ``block_idx`` = parent's + 1 (0 at the root);
- the index holds exactly the nodes of the tree and a block id appears at most once;
- each parent's sorted list holds exactly its children's (extra key, tokens, block id), sorted;
- a hit is confirmed by comparing stored tokens and extra key, so a hash collision can never
  return blocks that hold other tokens.

The cache keeps no clock and no ref counts: the LRU order of cached blocks and whether a block is
referenced live in ``BlockPool`` and are combined by ``KVCacheManager``. May import: the standard
library and ``hashing`` only.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

from .hashing import ROOT_HASH, block_hasher

__all__ = ["CacheMatch", "CacheStats", "PartialMatch", "RadixCache"]

# A child's entry in its parent's sorted list: (extra key, tokens, block id).
_SortKey = tuple[int, tuple[int, ...], int]


@dataclass(frozen=True, slots=True)
class CacheMatch:
    """Result of a prefix lookup: the cached blocks of the longest chain, root first.

    ``num_tokens`` = ``len(block_ids) * block_size`` (only full blocks are ever cached).
    """

    block_ids: tuple[int, ...] = ()
    num_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PartialMatch:
    """A cached block whose first ``num_tokens`` tokens (0 < num_tokens < block_size) are the
    next tokens of a prompt, at the position right after a chain of full hits: its KV for those
    positions is what the prompt's would be (same tokens before them, same positions)."""

    block_id: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of a ``RadixCache`` since construction (``num_partial_hit_tokens``: the tokens
    ``match_partial`` found, besides the full blocks of ``num_hit_tokens``)."""

    num_lookups: int = 0
    num_hit_tokens: int = 0
    num_evictions: int = 0
    num_cached_blocks: int = 0
    num_partial_hit_tokens: int = 0


@dataclass(slots=True, eq=False)
class _Node:
    block_hash: int
    block_id: int
    block_idx: int
    token_ids: tuple[int, ...]
    extra_key: int
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    # The children's sort keys, sorted (see the module docstring).
    sorted_children: list[_SortKey] = field(default_factory=list)


class RadixCache:
    """Tree of cached full blocks keyed by chained block hashes; see the module docstring."""

    def __init__(self, block_size: int, hash_seed: int = 0) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0 <= hash_seed < (1 << 64):
            raise ValueError(f"hash_seed must be in [0, 2**64), got {hash_seed}")
        self._block_size = block_size
        self._hash_seed = hash_seed
        self._hasher = block_hasher(block_size, hash_seed)
        self._root_children: dict[int, _Node] = {}
        self._root_sorted: list[_SortKey] = []
        self._nodes_by_block_id: list[_Node | None] = []
        self._num_cached_blocks = 0
        self._num_lookups = 0
        self._num_hit_tokens = 0
        self._num_evictions = 0
        self._num_partial_hit_tokens = 0

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_cached_blocks(self) -> int:
        return self._num_cached_blocks

    def _children(self, parent: _Node | None) -> dict[int, _Node]:
        return self._root_children if parent is None else parent.children

    def _sorted_children(self, parent: _Node | None) -> list[_SortKey]:
        return self._root_sorted if parent is None else parent.sorted_children

    def _block_tokens(self, token_ids: Sequence[int], block_idx: int) -> tuple[int, ...]:
        start = block_idx * self._block_size
        return tuple(token_ids[start : start + self._block_size])

    def _hash(self, parent: _Node | None, token_ids: tuple[int, ...], extra_key: int) -> int:
        return self._hasher(ROOT_HASH if parent is None else parent.block_hash, token_ids, extra_key)

    def match(self, token_ids: Sequence[int], extra_key: int = 0) -> CacheMatch:
        """Longest chain of cached blocks holding the full blocks of ``token_ids``.

        Reads the tree only (hashing stops at the first miss). Counts one lookup and the hit
        tokens in ``stats()``.
        """
        block_ids: list[int] = []
        hasher, size = self._hasher, self._block_size
        children, parent_hash = self._root_children, ROOT_HASH
        for start in range(0, len(token_ids) - size + 1, size):
            block_tokens = tuple(token_ids[start : start + size])
            node = children.get(hasher(parent_hash, block_tokens, extra_key))
            # A hash hit counts only if the content is equal: a collision is a miss.
            if node is None or node.token_ids != block_tokens or node.extra_key != extra_key:
                break
            block_ids.append(node.block_id)
            children, parent_hash = node.children, node.block_hash
        num_tokens = len(block_ids) * self._block_size
        self._num_lookups += 1
        self._num_hit_tokens += num_tokens
        return CacheMatch(block_ids=tuple(block_ids), num_tokens=num_tokens)

    def match_partial(
        self,
        parent_block_id: int | None,
        token_ids: Sequence[int],
        extra_key: int = 0,
        *,
        exclude: Container[int] = (),
    ) -> PartialMatch | None:
        """The cached child of ``parent_block_id`` (None: the root) whose leading tokens agree
        longest with ``token_ids`` (the prompt's tokens from that child's position on; only the
        first ``block_size - 1`` are read), leaving out the block ids in ``exclude``; None when
        no such child shares a first token. A tie goes to the child nearest the prompt's place in
        sorted order, the left side first. Costs a binary search and a few comparisons, plus one
        for each excluded child stepped over. Reads the tree only; counts the tokens found in
        ``stats()``. ValueError when ``parent_block_id`` is not cached.
        """
        size = self._block_size
        tail = tuple(token_ids[: size - 1])
        if not tail:
            return None
        parent = None if parent_block_id is None else self._node(parent_block_id)
        entries = self._sorted_children(parent)
        place = bisect_left(entries, (extra_key, tail, -1))
        best: PartialMatch | None = None
        # Leftwards, then rightwards from the prompt's place: the shared run only shrinks with
        # the distance, so each side ends at its first entry not excluded (or one sharing no
        # more than the best so far); the excluded ones before it are stepped over.
        for step in (-1, 1):
            i = place - 1 if step < 0 else place
            while 0 <= i < len(entries):
                key, tokens, block_id = entries[i]
                if key != extra_key:
                    break
                run = 0
                for a, b in zip(tokens, tail, strict=False):
                    if a != b:
                        break
                    run += 1
                if run == 0 or (best is not None and run <= best.num_tokens):
                    break
                if block_id not in exclude:
                    best = PartialMatch(block_id, run)
                    break
                i += step
        if best is not None:
            self._num_partial_hit_tokens += best.num_tokens
        return best

    def insert(
        self,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        extra_key: int = 0,
        *,
        start_block_idx: int = 0,
    ) -> int:
        """Cache the chain ``block_ids``; block i holds ``token_ids[i*bs:(i+1)*bs]``.

        Walks from the root. A position already cached with the same block id is skipped; a
        position cached with a different block id (same content computed elsewhere, or a hash
        collision) stops the insertion there, so a cached node's ancestors are always blocks
        of one sequence's chain. Returns the number of blocks newly inserted.

        ``start_block_idx`` > 0 resumes the walk at the node of ``block_ids[start_block_idx-1]``
        instead of re-hashing the chain from the root; that block must be cached at that
        position with those tokens (a previous insert of the same chain got past it).

        Raises ValueError when ``token_ids`` cover fewer than ``len(block_ids)`` full blocks,
        when a block id to insert is already cached elsewhere (or twice in ``block_ids``), when
        a block id is cached here with other tokens, or when ``start_block_idx`` is not a cached
        position of this chain.
        """
        return self.insert_chain(token_ids, block_ids, extra_key, start_block_idx=start_block_idx)[0]

    def insert_chain(
        self,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        extra_key: int = 0,
        *,
        start_block_idx: int = 0,
    ) -> tuple[int, int]:
        """``insert``, returning (blocks newly inserted, the chain's reach): ``block_ids[:reach]``
        are now cached at their positions as this chain, and position ``reach`` (when less than
        ``len(block_ids)``) is held by another block. Same arguments and errors as ``insert``."""
        num_blocks = len(block_ids)
        if len(token_ids) < num_blocks * self._block_size:
            raise ValueError(
                f"token_ids has {len(token_ids)} tokens, fewer than the {num_blocks} full "
                f"blocks of {self._block_size} tokens in block_ids"
            )
        if not 0 <= start_block_idx <= num_blocks:
            raise ValueError(f"start_block_idx must be in [0, {num_blocks}], got {start_block_idx}")
        parent: _Node | None = None
        if start_block_idx > 0:
            prev_idx = start_block_idx - 1
            parent = self._lookup(block_ids[prev_idx])
            if (
                parent is None
                or parent.block_idx != prev_idx
                or parent.extra_key != extra_key
                or parent.token_ids != self._block_tokens(token_ids, prev_idx)
            ):
                raise ValueError(
                    f"start_block_idx={start_block_idx}: block {block_ids[prev_idx]} is not "
                    f"cached at position {prev_idx} with these tokens"
                )
        num_inserted = 0
        # `_block_tokens`, `_hash` and `_children` written out: this loop runs for every block
        # a sequence fills.
        by_block_id, hasher, size = self._nodes_by_block_id, self._hasher, self._block_size
        children = self._root_children if parent is None else parent.children
        parent_hash = ROOT_HASH if parent is None else parent.block_hash
        for block_idx in range(start_block_idx, num_blocks):
            block_id = block_ids[block_idx]
            start = block_idx * size
            block_tokens = tuple(token_ids[start : start + size])
            block_hash = hasher(parent_hash, block_tokens, extra_key)
            node = children.get(block_hash)
            if node is not None:
                if node.block_id != block_id:
                    return num_inserted, block_idx  # someone else's block holds this position
                if node.token_ids != block_tokens or node.extra_key != extra_key:
                    raise ValueError(
                        f"block {block_id} is cached with other tokens than the ones given"
                    )
            else:
                if block_id < 0:
                    raise ValueError(f"block ids are >= 0, got {block_id}")
                if block_id >= len(by_block_id):
                    by_block_id.extend([None] * (block_id + 1 - len(by_block_id)))
                elif by_block_id[block_id] is not None:
                    raise ValueError(f"block {block_id} is already cached at another position")
                node = _Node(block_hash, block_id, block_idx, block_tokens, extra_key, parent, {}, [])
                children[block_hash] = node
                insort(self._root_sorted if parent is None else parent.sorted_children,
                       (extra_key, block_tokens, block_id))
                by_block_id[block_id] = node
                self._num_cached_blocks += 1
                num_inserted += 1
            parent, children, parent_hash = node, node.children, block_hash
        return num_inserted, num_blocks

    def _lookup(self, block_id: int) -> _Node | None:
        """The node of ``block_id``, None when it is not cached (any int, negative included)."""
        nodes = self._nodes_by_block_id
        return nodes[block_id] if 0 <= block_id < len(nodes) else None

    def _node(self, block_id: int) -> _Node:
        node = self._lookup(block_id)
        if node is None:
            raise ValueError(f"block {block_id} is not cached")
        return node

    def is_cached(self, block_id: int) -> bool:
        return self._lookup(block_id) is not None

    def is_leaf(self, block_id: int) -> bool:
        """Whether the cached ``block_id`` has no cached children; ValueError if not cached."""
        return not self._node(block_id).children

    def parent_block_id(self, block_id: int) -> int | None:
        """Block id of the cached ``block_id``'s parent, None under the root; ValueError if not
        cached."""
        parent = self._node(block_id).parent
        return None if parent is None else parent.block_id

    def block_token_ids(self, block_id: int) -> tuple[int, ...]:
        """Tokens the cached ``block_id`` holds; ValueError if not cached."""
        return self._node(block_id).token_ids

    def evict(self, block_id: int) -> None:
        """Remove the cached leaf ``block_id``; ValueError if not cached or not a leaf."""
        node = self._node(block_id)
        if node.children:
            raise ValueError(f"block {block_id} is not a leaf ({len(node.children)} children)")
        del self._children(node.parent)[node.block_hash]
        entries = self._sorted_children(node.parent)
        entries.pop(bisect_left(entries, (node.extra_key, node.token_ids, block_id)))
        self._nodes_by_block_id[block_id] = None
        self._num_cached_blocks -= 1
        self._num_evictions += 1

    def stats(self) -> CacheStats:
        return CacheStats(
            num_lookups=self._num_lookups,
            num_hit_tokens=self._num_hit_tokens,
            num_evictions=self._num_evictions,
            num_cached_blocks=self.num_cached_blocks,
            num_partial_hit_tokens=self._num_partial_hit_tokens,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError on a broken link, hash, index entry or duplicate block id."""
        seen: dict[int, _Node] = {}
        stack: list[tuple[_Node | None, dict[int, _Node]]] = [(None, self._root_children)]
        while stack:  # iterative: chains of long sequences are deeper than the recursion limit
            parent, children = stack.pop()
            for key, node in children.items():
                if node.parent is not parent:
                    raise AssertionError(f"block {node.block_id}: parent link disagrees")
                if key != node.block_hash:
                    raise AssertionError(f"block {node.block_id} filed under another hash")
                if node.block_hash != self._hash(parent, node.token_ids, node.extra_key):
                    raise AssertionError(f"block {node.block_id}: hash does not recompute")
                if len(node.token_ids) != self._block_size:
                    raise AssertionError(
                        f"block {node.block_id} holds {len(node.token_ids)} tokens"
                    )
                expected_idx = 0 if parent is None else parent.block_idx + 1
                if node.block_idx != expected_idx:
                    raise AssertionError(
                        f"block {node.block_id} at block_idx {node.block_idx}, "
                        f"expected {expected_idx}"
                    )
                if node.block_id in seen:
                    raise AssertionError(f"block {node.block_id} appears twice in the tree")
                seen[node.block_id] = node
                if self._lookup(node.block_id) is not node:
                    raise AssertionError(f"index entry of block {node.block_id} is wrong")
                stack.append((node, node.children))
            # after the nodes' own checks, which name a corrupted node more precisely
            expected = sorted((n.extra_key, n.token_ids, n.block_id) for n in children.values())
            if self._sorted_children(parent) != expected:
                raise AssertionError(
                    f"the sorted children of {'the root' if parent is None else parent.block_id} "
                    "are not its children's keys in order"
                )
        num_indexed = sum(node is not None for node in self._nodes_by_block_id)
        if not len(seen) == num_indexed == self._num_cached_blocks:
            raise AssertionError(
                f"index has {num_indexed} blocks, tree has {len(seen)}, counter says "
                f"{self._num_cached_blocks}"
            )
        if min(self._num_lookups, self._num_hit_tokens, self._num_evictions, self._num_partial_hit_tokens) < 0:
            raise AssertionError("a counter is negative")
        if self._num_hit_tokens % self._block_size != 0:
            raise AssertionError("num_hit_tokens is not a whole number of blocks")
