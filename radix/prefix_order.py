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
    excluded). O(total tokens): one dict of (parent node, token) -> node."""
    node_by_edge: dict[tuple[int, int], int] = {}
    for token_ids in token_id_lists:
        node = 0  # the root
        for token_id in token_ids:
            edge = (node, token_id)
            child = node_by_edge.get(edge)
            if child is None:
                child = len(node_by_edge) + 1
                node_by_edge[edge] = child
            node = child
    return len(node_by_edge)
