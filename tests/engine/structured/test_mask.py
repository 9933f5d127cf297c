"""Bitmask unpacking against a per-bit reference, the grammar mask on logits rows, and the compiled
CPU op against the PyTorch reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.structured.mask import apply_grammar_mask, unpack_bitmask
from batchgen.kernels import apply_token_bitmask
from batchgen.kernels.attention_cpu import (
    apply_token_bitmask_cpu,
    is_cpu_kernel_available,
    load_cpu_kernel,
)
from batchgen.kernels.token_bitmask import apply_token_bitmask_torch


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


def _pack(allowed: list[list[bool]]) -> torch.Tensor:
    """int32 [rows, words] with bit t % 32 of word t // 32 set where allowed[row][t]."""
    words = (len(allowed[0]) + 31) // 32
    out = []
    for row in allowed:
        packed = [0] * words
        for t, ok in enumerate(row):
            if ok:
                packed[t // 32] |= 1 << (t % 32)
        out.append([w - (1 << 32) if w >= 1 << 31 else w for w in packed])
    return torch.tensor(out, dtype=torch.int32)


def test_apply_masks_only_the_given_rows() -> None:
    x = torch.arange(24, dtype=torch.float32).reshape(3, 8)
    before = x.clone()
    allowed = [[t in (1, 5) for t in range(8)], [t == 7 for t in range(8)]]
    empty = apply_grammar_mask(x, torch.tensor([2, 0]), _pack(allowed))
    assert empty == []
    assert torch.equal(x[1], before[1])
    inf = float("-inf")
    assert x[2].tolist() == [inf, 17.0, inf, inf, inf, 21.0, inf, inf]
    assert x[0].tolist() == [inf] * 7 + [7.0]


def test_apply_reports_rows_left_with_nothing() -> None:
    x = torch.zeros(2, 4)
    x[1, 2] = float("-inf")  # another processor banned token 2
    bitmask = _pack([[True, False, False, False], [False, False, True, False]])
    assert apply_grammar_mask(x, torch.tensor([0, 1]), bitmask) == [1]
    with pytest.raises(ValueError, match="bitmask must be"):
        apply_grammar_mask(x, torch.tensor([0]), bitmask)
    with pytest.raises(ValueError, match="distinct"):
        apply_grammar_mask(x, torch.tensor([1, 1]), bitmask)
    with pytest.raises(ValueError, match="distinct"):
        apply_grammar_mask(x, torch.tensor([0, 2]), bitmask)


def _random_case(seed: int, num_rows: int, num_words: int, vocab_delta: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits with -inf, NaN and +inf here and there; masks dense, sparse, empty and full; the
    vocabulary narrower or wider than the mask; a random subset of rows in a random order."""
    gen = torch.Generator().manual_seed(seed)
    vocab = max(1, 32 * num_words + vocab_delta)
    x = torch.randn(num_rows, vocab, generator=gen)
    special = torch.rand(num_rows, vocab, generator=gen)
    x[special < 0.05] = float("-inf")
    x[(special > 0.05) & (special < 0.06)] = float("nan")
    x[special > 0.995] = float("inf")
    k = int(torch.randint(0, num_rows + 1, (1,), generator=gen))
    rows = torch.randperm(num_rows, generator=gen)[:k]
    words = torch.randint(-(2**31), 2**31 - 1, (k, num_words), generator=gen, dtype=torch.int64).to(torch.int32)
    for i in range(k):
        kind = int(torch.randint(0, 4, (1,), generator=gen))
        if kind == 1:  # a few tokens: most words 0, the grammar's usual case
            keep = torch.rand(num_words, generator=gen) < 0.1
            words[i] = torch.where(keep, words[i], torch.zeros_like(words[i]))
        elif kind == 2:
            words[i] = 0
        elif kind == 3:
            words[i] = -1
    return x, rows, words


@pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")
@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(1, 5), st.integers(-40, 40))
def test_the_compiled_op_equals_the_torch_reference(seed: int, num_rows: int, num_words: int, vocab_delta: int) -> None:
    """Same logits written (NaN where NaN) and same rows reported empty, for masks of every kind."""
    load_cpu_kernel()
    x, rows, bitmask = _random_case(seed, num_rows, num_words, vocab_delta)
    expected_x = x.clone()
    expected = apply_token_bitmask_torch(expected_x, rows, bitmask)
    got = apply_token_bitmask(x, rows, bitmask)
    assert torch.equal(got, expected)
    assert torch.equal(torch.isnan(x), torch.isnan(expected_x))
    assert torch.equal(torch.nan_to_num(x, nan=7.0), torch.nan_to_num(expected_x, nan=7.0))


@pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")
def test_the_compiled_op_at_a_step_s_size_with_two_threads() -> None:
    """64 rows of a 49,152-token vocabulary (the built-in model's), parallel over rows."""
    load_cpu_kernel()
    x, rows, bitmask = _random_case(5, 64, 49152 // 32, 0)
    assert rows.shape[0] > 32  # most of the batch is constrained (seed chosen for it)
    expected_x = x.clone()
    expected = apply_token_bitmask_torch(expected_x, rows, bitmask)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = apply_token_bitmask(x, rows, bitmask)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(got, expected)
    assert torch.equal(torch.nan_to_num(x, nan=7.0), torch.nan_to_num(expected_x, nan=7.0))
    with pytest.raises(RuntimeError, match="listed twice"):
        apply_token_bitmask_cpu(x, torch.tensor([3, 3]), bitmask[:2])
    with pytest.raises(RuntimeError, match="outside"):
        apply_token_bitmask_cpu(x, torch.tensor([64]), bitmask[:1])
