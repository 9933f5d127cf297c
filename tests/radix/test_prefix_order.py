"""prefix_order and trie_token_count against hand-worked tries and naive references."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.radix.prefix_order import prefix_order, trie_token_count


def test_prefix_order_groups_shared_prefixes() -> None:
    prompts = [[5, 1], [1, 2, 3], [5, 0, 9], [1, 2], [1, 9], [5, 1]]
    assert prefix_order(prompts) == [3, 1, 4, 2, 0, 5]


def test_prefix_order_is_stable_for_equal_lists() -> None:
    assert prefix_order([[2], [1], [2], [1]]) == [1, 3, 0, 2]


def test_prefix_order_empty_inputs() -> None:
    assert prefix_order([]) == []
    assert prefix_order([[3], [], [1]]) == [1, 2, 0]


def test_prefix_order_accepts_mixed_sequence_types() -> None:
    assert prefix_order([(2, 1), [1, 5], range(1, 3)]) == [2, 1, 0]


def test_trie_token_count_exact() -> None:
    # Trie: 1-2-3, 1-2 (inside), 1-9, 5-1, 5-0-9 -> nodes 1,2,3,9 | 5,1,0,9 = 8
    prompts = [[5, 1], [1, 2, 3], [5, 0, 9], [1, 2], [1, 9], [5, 1]]
    assert trie_token_count(prompts) == 8
    assert trie_token_count([]) == 0
    assert trie_token_count([[], []]) == 0
    assert trie_token_count([[7, 7, 7]]) == 3
    # Same token under different parents are different nodes.
    assert trie_token_count([[1, 2], [2, 2]]) == 4


_Trie = dict[int, "_Trie"]


def _dfs_order(lists: list[list[int]]) -> list[int]:
    """Reference: build a dict trie, walk it depth-first, children by ascending token."""
    root: _Trie = {}
    ends: dict[int, list[int]] = {}  # id(node) -> indices of the lists ending there
    for idx, tokens in enumerate(lists):
        node = root
        for token in tokens:
            node = node.setdefault(token, {})
        ends.setdefault(id(node), []).append(idx)
    order: list[int] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order.extend(ends.get(id(node), []))
        stack.extend(node[token] for token in sorted(node, reverse=True))
    return order


_LISTS = st.lists(st.lists(st.integers(0, 3), max_size=6), max_size=12)


@settings(max_examples=200, deadline=None)
@given(lists=_LISTS)
def test_prefix_order_is_the_trie_dfs(lists: list[list[int]]) -> None:
    order = prefix_order(lists)
    assert order == _dfs_order(lists)
    assert sorted(order) == list(range(len(lists)))


@settings(max_examples=200, deadline=None)
@given(lists=_LISTS)
def test_trie_token_count_is_the_number_of_distinct_prefixes(lists: list[list[int]]) -> None:
    prefixes = {tuple(tokens[: i + 1]) for tokens in lists for i in range(len(tokens))}
    assert trie_token_count(lists) == len(prefixes)


@settings(max_examples=200, deadline=None)
@given(lists=st.lists(st.lists(st.integers(0, 1), min_size=20, max_size=60), max_size=8))
def test_trie_token_count_of_long_lists_sharing_long_prefixes(lists: list[list[int]]) -> None:
    lists = [[0] * 30 + tokens for tokens in lists]  # common prefixes of 30 tokens and more
    prefixes = {tuple(tokens[: i + 1]) for tokens in lists for i in range(len(tokens))}
    assert trie_token_count(lists) == len(prefixes)
