"""The KV block pool: reference counts and the free queue.

Owns, for each of ``num_blocks`` block ids ``0..num_blocks-1``, its reference count, and the free
queue of the blocks whose count is 0, in LRU order::

    free queue:  | LRU head: taken first by pop_free | ... | MRU tail: kept longest |

``decref(keep=True)`` puts a block that still holds cached content at the MRU tail;
``decref(keep=False)`` puts a block with nothing worth keeping at the LRU head, so it is reused
first. ``incref`` of a free block takes it out of the queue wherever it is (the LRU "touch").
Every operation is O(1) (an ``OrderedDict`` is the doubly linked list).

Invariants (``check_invariants``): every ref count is >= 0; a block is in the free queue exactly
when its ref count is 0; ``num_free_blocks + num_used_blocks == num_blocks``.

The pool knows nothing about tokens, sequences or the radix tree. May import: the standard
library only.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["BlockPool"]


class BlockPool:
    """Fixed pool of block ids with ref counts and an O(1) LRU free queue.

    At construction every block is free and the free order is ``0, 1, ..., num_blocks - 1``.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._ref_counts: list[int] = [0] * num_blocks
        # Keys in LRU order (head first); values unused.
        self._free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0 (some may hold cached content)."""
        return len(self._free_queue)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref count >= 1."""
        return self._num_blocks - len(self._free_queue)

    def _check_block_id(self, block_id: int) -> None:
        if not 0 <= block_id < self._num_blocks:
            raise ValueError(f"block_id must be in [0, {self._num_blocks}), got {block_id}")

    def ref_count(self, block_id: int) -> int:
        """Current ref count of ``block_id``; ValueError for an id outside the pool."""
        self._check_block_id(block_id)
        return self._ref_counts[block_id]

    def pop_free(self) -> int | None:
        """Take the LRU head of the free queue and set its ref count to 1; None when none free."""
        if not self._free_queue:
            return None
        block_id, _ = self._free_queue.popitem(last=False)
        self._ref_counts[block_id] = 1
        return block_id

    def incref(self, block_id: int) -> None:
        """Add one reference; a free block (count 0) leaves the free queue."""
        self._check_block_id(block_id)
        if self._ref_counts[block_id] == 0:
            del self._free_queue[block_id]
        self._ref_counts[block_id] += 1

    def decref(self, block_id: int, *, keep: bool) -> None:
        """Drop one reference. At count 0 the block enters the free queue.

        ``keep=True``: it holds content worth keeping, so it goes to the MRU tail (evicted last).
        ``keep=False``: nothing to keep, so it goes to the LRU head (reused first).
        Raises ValueError when the count is already 0.
        """
        self._check_block_id(block_id)
        if self._ref_counts[block_id] == 0:
            raise ValueError(f"decref of block {block_id}, whose ref count is already 0")
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] == 0:
            self._free_queue[block_id] = None
            if not keep:
                self._free_queue.move_to_end(block_id, last=False)

    def free_order(self) -> list[int]:
        """The free queue as a list, LRU head first (O(num_free_blocks); for tests and checks)."""
        return list(self._free_queue)

    def check_invariants(self) -> None:
        """Raise AssertionError when ref counts and the free queue disagree."""
        if len(self._ref_counts) != self._num_blocks:
            raise AssertionError(
                f"{len(self._ref_counts)} ref counts for {self._num_blocks} blocks"
            )
        for block_id in self._free_queue:
            if not 0 <= block_id < self._num_blocks:
                raise AssertionError(f"free queue holds block id {block_id} outside the pool")
        num_zero = 0
        for block_id, count in enumerate(self._ref_counts):
            if count < 0:
                raise AssertionError(f"block {block_id} has ref count {count} < 0")
            is_free = block_id in self._free_queue
            if (count == 0) != is_free:
                raise AssertionError(
                    f"block {block_id} has ref count {count} but is_free={is_free}"
                )
            num_zero += count == 0
        if num_zero != len(self._free_queue):
            raise AssertionError(f"{num_zero} blocks at count 0, {len(self._free_queue)} free")
        if self.num_free_blocks + self.num_used_blocks != self._num_blocks:
            raise AssertionError("num_free_blocks + num_used_blocks != num_blocks")
