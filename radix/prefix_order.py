"""Prefix ordering of prompts: visit a window of tokenized prompts in token-trie order.

Owns no state: two pure functions over lists of token ids.

- ``prefix_order`` puts prompts that share a prefix next to each other, so the radix cache still
  holds the shared blocks when the next prompt of the group is admitted. The order is the
  depth-first (pre-order) walk of the token trie with children in ascending token id, which is
  the lexicographic order of the token lists (a prefix before its extensions); ties keep their
  input order.
- ``trie_token_count`` counts the nodes of the token trie of all lists: the prefill tokens a
  perfect prefix cache would compute, the ideal that benchmarks compare against.

May import: the standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["prefix_order", "trie_token_count"]


def prefix_order(token_id_lists: Sequence[Sequence[int]]) -> list[int]:
    """Indices of ``token_id_lists`` in depth-first order of their token trie.

    Equal lists keep their input order (stable). Does not modify the input.
    """
    keys = [tuple(token_ids) for token_ids in token_id_lists]
    return sorted(range(len(keys)), key=keys.__getitem__)


def trie_token_count(token_id_lists: Sequence[Sequence[int]]) -> int:
    """Number of distinct non-empty prefixes over all lists (nodes of their token trie, root
    excluded).

    In lexicographic order each list adds the prefixes it does not share with the one before
    it (the earlier list it shares most with): its length minus their common prefix. Sorting and
    comparing slices run in C, where walking a trie token by token ran the interpreter once per
    prompt token."""
    total = 0
    previous: tuple[int, ...] = ()
    for key in sorted(tuple(token_ids) for token_ids in token_id_lists):
        total += len(key) - _common_prefix_length(previous, key)
        previous = key
    return total


def _common_prefix_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix of `a` and `b` (a binary search over slices)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low
