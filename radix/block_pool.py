"""The KV block pool: reference counts and the free queue.

Owns, for each of ``num_blocks`` block ids ``0..num_blocks-1``, its reference count, and the free
queue of the blocks whose count is 0. The queue has three parts::

    | unkept: freed with nothing to keep, last freed first | fresh: never handed out, by id |
    | kept: freed holding cached content, LRU head first ... MRU tail |

``pop_free`` takes the unkept part first. Then, in a pool whose memory is committed up front
(a GPU's), the fresh blocks come before the kept ones, so cached content stays as long as the
pool has room. In a pool whose memory is committed as a block is first written
(``is_lazily_committed``: a CPU pool mapped lazily, ``kernels.lazy_zeros``) the kept blocks come
before the fresh ones: a block that was written before is reused (its cached content evicted,
least recently used first) ahead of one whose pages are not yet committed, so the committed
blocks number the peak of blocks in use, not the pool's size::

    committed pool:  pop order  unkept | fresh | kept
    lazy pool:       pop order  unkept | kept  | fresh

``decref(keep=True)`` puts a block at the MRU tail of the kept part; ``decref(keep=False)`` at
the head of the unkept part, so it is reused first. ``incref`` of a free block takes it out of
the queue wherever it is (the LRU "touch"). Every operation is O(1) (each part is an
``OrderedDict``, a doubly linked list).

Invariants (``check_invariants``): every ref count is >= 0; a block is in exactly one part of
the free queue exactly when its ref count is 0; ``num_free_blocks + num_used_blocks ==
num_blocks``. Blocks enter the fresh part only at construction, so a fresh block was never
handed out.

The pool knows nothing about tokens, sequences or the radix tree. May import: the standard
library only.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["BlockPool"]


class BlockPool:
    """Fixed pool of block ids with ref counts and an O(1) LRU free queue.

    At construction every block is fresh and the fresh order is ``0, 1, ..., num_blocks - 1``.
    ``is_lazily_committed``: the blocks' memory is committed when a block is first written, so
    a block used before is handed out ahead of a fresh one (see the module docstring).
    """

    def __init__(self, num_blocks: int, block_size: int, *, is_lazily_committed: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._is_lazily_committed = is_lazily_committed
        self._ref_counts: list[int] = [0] * num_blocks
        # Keys in pop order (head first); values unused.
        self._unkept: OrderedDict[int, None] = OrderedDict()
        self._fresh: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._kept: OrderedDict[int, None] = OrderedDict()

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def is_lazily_committed(self) -> bool:
        return self._is_lazily_committed

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0 (some may hold cached content)."""
        return len(self._unkept) + len(self._fresh) + len(self._kept)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref count >= 1."""
        return self._num_blocks - self.num_free_blocks

    @property
    def num_handed_out_blocks(self) -> int:
        """Blocks handed out at least once (``pop_free`` or ``incref``): in a lazily committed
        pool, the blocks whose memory may be committed."""
        return self._num_blocks - len(self._fresh)

    def _check_block_id(self, block_id: int) -> None:
        if not 0 <= block_id < self._num_blocks:
            raise ValueError(f"block_id must be in [0, {self._num_blocks}), got {block_id}")

    def ref_count(self, block_id: int) -> int:
        """Current ref count of ``block_id``; ValueError for an id outside the pool."""
        self._check_block_id(block_id)
        return self._ref_counts[block_id]

    def _parts_in_pop_order(self) -> tuple[OrderedDict[int, None], ...]:
        if self._is_lazily_committed:
            return self._unkept, self._kept, self._fresh
        return self._unkept, self._fresh, self._kept

    def pop_free(self) -> int | None:
        """Take the head of the free queue (see the module docstring for the order) and set its
        ref count to 1; None when none is free."""
        for part in self._parts_in_pop_order():
            if part:
                block_id, _ = part.popitem(last=False)
                self._ref_counts[block_id] = 1
                return block_id
        return None

    def incref(self, block_id: int) -> None:
        """Add one reference; a free block (count 0) leaves the free queue."""
        self._check_block_id(block_id)
        if self._ref_counts[block_id] == 0:
            for part in (self._unkept, self._fresh, self._kept):
                if block_id in part:
                    del part[block_id]
                    break
        self._ref_counts[block_id] += 1

    def decref(self, block_id: int, *, keep: bool) -> None:
        """Drop one reference. At count 0 the block enters the free queue.

        ``keep=True``: it holds content worth keeping, so it goes to the MRU tail of the kept
        part (evicted last). ``keep=False``: nothing to keep, so it goes to the head of the
        unkept part (reused first). Raises ValueError when the count is already 0.
        """
        self._check_block_id(block_id)
        if self._ref_counts[block_id] == 0:
            raise ValueError(f"decref of block {block_id}, whose ref count is already 0")
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] == 0:
            if keep:
                self._kept[block_id] = None
            else:
                self._unkept[block_id] = None
                self._unkept.move_to_end(block_id, last=False)

    def free_order(self) -> list[int]:
        """The free queue as a list in pop order, head first (O(num_free_blocks); for tests and
        checks)."""
        return [block_id for part in self._parts_in_pop_order() for block_id in part]

    def check_invariants(self) -> None:
        """Raise AssertionError when ref counts and the free queue disagree."""
        if len(self._ref_counts) != self._num_blocks:
            raise AssertionError(
                f"{len(self._ref_counts)} ref counts for {self._num_blocks} blocks"
            )
        free: set[int] = set()
        for part in (self._unkept, self._fresh, self._kept):
            for block_id in part:
                if not 0 <= block_id < self._num_blocks:
                    raise AssertionError(f"free queue holds block id {block_id} outside the pool")
                if block_id in free:
                    raise AssertionError(f"block {block_id} is in the free queue twice")
                free.add(block_id)
        num_zero = 0
        for block_id, count in enumerate(self._ref_counts):
            if count < 0:
                raise AssertionError(f"block {block_id} has ref count {count} < 0")
            is_free = block_id in free
            if (count == 0) != is_free:
                raise AssertionError(
                    f"block {block_id} has ref count {count} but is_free={is_free}"
                )
            num_zero += count == 0
        if num_zero != len(free):
            raise AssertionError(f"{num_zero} blocks at count 0, {len(free)} free")
        if self.num_free_blocks + self.num_used_blocks != self._num_blocks:
            raise AssertionError("num_free_blocks + num_used_blocks != num_blocks")
