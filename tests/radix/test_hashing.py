"""Block hashing: byte layout, chaining, seeds and argument checks."""

from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.radix.hashing import ROOT_HASH, block_hasher, hash_block, hash_blocks


def test_root_hash_is_zero() -> None:
    assert ROOT_HASH == 0


def test_hash_block_byte_layout_is_fixed_width_little_endian() -> None:
    data = struct.pack("<QQ", 7, 3) + struct.pack("<4q", 1, 2, 300, -1)
    assert hash_block(7, [1, 2, 300, -1], extra_key=3, seed=11) == xxhash.xxh3_64_intdigest(
        data, seed=11
    )


def test_hash_block_defaults_match_explicit_zeroes() -> None:
    tokens = (5, 6, 7, 8)
    assert hash_block(ROOT_HASH, tokens) == hash_block(0, tokens, extra_key=0, seed=0)
    assert hash_block(ROOT_HASH, tokens) == xxhash.xxh3_64_intdigest(
        struct.pack("<QQ4q", 0, 0, *tokens)
    )


def test_hash_block_accepts_list_tuple_and_range() -> None:
    assert hash_block(1, [0, 1, 2]) == hash_block(1, (0, 1, 2)) == hash_block(1, range(3))


def test_every_input_changes_the_hash() -> None:
    base = hash_block(1, [1, 2, 3, 4], extra_key=2, seed=3)
    assert hash_block(9, [1, 2, 3, 4], extra_key=2, seed=3) != base
    assert hash_block(1, [1, 2, 3, 5], extra_key=2, seed=3) != base
    assert hash_block(1, [1, 2, 3, 4], extra_key=9, seed=3) != base
    assert hash_block(1, [1, 2, 3, 4], extra_key=2, seed=9) != base
    # Fixed width: [1, 2] and [1 + 2 * 2**32] do not collide by concatenation.
    assert hash_block(0, [1, 2]) != hash_block(0, [1 + (2 << 32)])


def test_hash_blocks_chains_full_blocks_only() -> None:
    tokens = list(range(10))
    first = hash_block(ROOT_HASH, tokens[0:4], 5, 6)
    second = hash_block(first, tokens[4:8], 5, 6)
    assert hash_blocks(tokens, 4, extra_key=5, seed=6) == [first, second]
    assert hash_blocks(tokens[:3], 4) == []
    assert hash_blocks([], 4) == []


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=40),
    block_size=st.integers(min_value=1, max_value=8),
    extra_key=st.integers(min_value=0, max_value=2**64 - 1),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_hash_blocks_equals_folded_hash_block(
    tokens: list[int], block_size: int, extra_key: int, seed: int
) -> None:
    expected: list[int] = []
    parent = ROOT_HASH
    for block_idx in range(len(tokens) // block_size):
        block = tokens[block_idx * block_size : (block_idx + 1) * block_size]
        parent = hash_block(parent, block, extra_key, seed)
        expected.append(parent)
    assert hash_blocks(tokens, block_size, extra_key, seed) == expected
    assert all(0 <= h < 2**64 for h in expected)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"parent_hash": -1}, "parent_hash"),
        ({"parent_hash": 2**64}, "parent_hash"),
        ({"extra_key": -1}, "extra_key"),
        ({"seed": 2**64}, "seed"),
    ],
)
def test_hash_block_rejects_out_of_range(kwargs: dict[str, int], name: str) -> None:
    args: dict[str, int] = {"parent_hash": 0, "extra_key": 0, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=name):
        hash_block(args["parent_hash"], [1], extra_key=args["extra_key"], seed=args["seed"])


def test_hash_rejects_token_outside_int64() -> None:
    with pytest.raises(OverflowError):
        hash_block(0, [2**63])


def test_hash_blocks_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        hash_blocks([1, 2], 0)


@settings(max_examples=200)
@given(
    st.integers(1, 8),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=0, max_size=10),
)
def test_block_hasher_equals_hash_block(block_size: int, seed: int, parent: int, extra: int, tokens: list[int]) -> None:
    # Blocks of its size take the packed path, others (shorter, longer) hash_block's.
    hasher = block_hasher(block_size, seed)
    assert hasher(parent, tokens, extra) == hash_block(parent, tokens, extra, seed)
    assert hasher(parent, tuple(tokens)) == hash_block(parent, tokens, 0, seed)


@pytest.mark.parametrize(
    ("parent", "tokens", "extra", "error"),
    [
        (-1, [1, 2], 0, ValueError),
        (2**64, [1, 2], 0, ValueError),
        (0, [1, 2], -1, ValueError),
        (0, [1, 2**63], 0, OverflowError),
        (0, [-(2**63) - 1, 2], 0, OverflowError),
    ],
)
def test_block_hasher_raises_what_hash_block_raises(parent: int, tokens: list[int], extra: int, error: type[Exception]) -> None:
    hasher = block_hasher(2)
    with pytest.raises(error):
        hasher(parent, tokens, extra)
    with pytest.raises(error):
        hash_block(parent, tokens, extra)
    with pytest.raises(ValueError, match="seed"):
        block_hasher(2, 2**64)
    with pytest.raises(ValueError, match="block_size"):
        block_hasher(0)
