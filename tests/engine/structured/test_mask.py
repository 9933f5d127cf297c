"""Bitmask unpacking against a per-bit reference, and the grammar mask on logits rows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.structured.mask import apply_grammar_mask, unpack_bitmask


def _reference(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bit j of word w allows token 32 w + j, by definition (one shift per bit)."""
    rows = []
    for row in bitmask.tolist():
        allowed = [False] * vocab_size
        for t in range(min(vocab_size, 32 * len(row))):
            allowed[t] = bool((row[t // 32] >> (t % 32)) & 1)
        rows.append(allowed)
    return torch.tensor(rows, dtype=torch.bool).reshape(len(rows), vocab_size)


@settings(max_examples=60)
@given(
    st.integers(1, 4),
    st.integers(1, 5),
    st.integers(-40, 40),
    st.integers(0, 2**32 - 1),
)
def test_unpack_matches_the_bit_definition(num_rows: int, num_words: int, vocab_delta: int, seed: int) -> None:
    """Random words (sign bit included) and vocabularies narrower or wider than the mask."""
    gen = torch.Generator().manual_seed(seed)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (num_rows, num_words), generator=gen, dtype=torch.int64).to(torch.int32)
    vocab_size = max(1, 32 * num_words + vocab_delta)
    assert torch.equal(unpack_bitmask(bitmask, vocab_size), _reference(bitmask, vocab_size))


def test_unpack_single_bits() -> None:
    bitmask = torch.zeros(3, 2, dtype=torch.int32)
    bitmask[0, 0] = 1  # token 0
    bitmask[1, 0] = -(2**31)  # bit 31: token 31
    bitmask[2, 1] = 1 << 5  # token 37
    allowed = unpack_bitmask(bitmask, 40)
    assert [row.nonzero().flatten().tolist() for row in allowed] == [[0], [31], [37]]
    with pytest.raises(ValueError, match="int32"):
        unpack_bitmask(bitmask.long(), 40)


def test_apply_masks_only_the_given_rows() -> None:
    x = torch.arange(24, dtype=torch.float32).reshape(3, 8)
    before = x.clone()
    allowed = torch.zeros(2, 8, dtype=torch.bool)
    allowed[0, [1, 5]] = True
    allowed[1, 7] = True
    empty = apply_grammar_mask(x, torch.tensor([2, 0]), allowed)
    assert empty == []
    assert torch.equal(x[1], before[1])
    inf = float("-inf")
    assert x[2].tolist() == [inf, 17.0, inf, inf, inf, 21.0, inf, inf]
    assert x[0].tolist() == [inf] * 7 + [7.0]


def test_apply_reports_rows_left_with_nothing() -> None:
    x = torch.zeros(2, 4)
    x[1, 2] = float("-inf")  # another processor banned token 2
    allowed = torch.tensor([[True, False, False, False], [False, False, True, False]])
    assert apply_grammar_mask(x, torch.tensor([0, 1]), allowed) == [1]
    with pytest.raises(ValueError, match="allowed must be"):
        apply_grammar_mask(x, torch.tensor([0]), allowed)
