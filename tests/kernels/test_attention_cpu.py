"""The compiled CPU paged-attention kernel against the PyTorch reference path.

The first test in a fresh environment builds the extension (tens of seconds, then cached).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from batchgen.kernels import paged_attention
from batchgen.kernels.attention_cpu import is_cpu_kernel_available, load_cpu_kernel

from .attention_cases import (
    OPTION_CASE,
    WINDOWS,
    Batch,
    in_cpu_layout,
    make_batch,
    max_error,
    naive_attention,
    poison_unseen_blocks,
    with_query_gain,
)

pytestmark = pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")

# (query_lens, context_lens): decode at len 1, at a block multiple, with a partial last block;
# prefill chunks over a prefix ending mid-block or on a boundary; plain prefill; a chunk longer
# than one query tile (16) over a long prefix; one longer than the AVX-512 path's wide tile (64),
# its last tile of 6 tokens, beside a short chunk that ends mid-span.
CASES = {
    "mixed": ((1, 1, 1, 5, 16, 20), (0, 31, 36, 19, 16, 0)),
    "decode_only": ((1, 1, 1, 1, 1), (0, 15, 16, 70, 130)),
    "prefill_only": ((3, 17, 32), (0, 5, 0)),
    "long_chunk_over_prefix": ((40, 1), (57, 90)),
    "chunk_over_two_wide_tiles": ((70, 3, 1), (21, 40, 47)),
}
# GQA groups 1, 4, 3 (SmolLM2) and 8 (Gemma 2 9B, Qwen3's 32/4 heads).
HEADS = [(4, 4), (8, 2), (9, 3), (16, 2)]
# head_dim 128 (7B-class Llama, Mistral, Qwen) and 256 (Gemma) run the P.V loops' second and
# later 64-float passes; 80 is no multiple of 16 (the generic loops everywhere).
HEAD_DIMS = [(32, 16), (64, 16), (64, 8), (128, 16), (256, 16), (80, 16)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize(("head_dim", "block_size"), HEAD_DIMS)
def test_cpu_kernel_matches_reference(
    case: str, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    query_lens, context_lens = CASES[case]
    batch = in_cpu_layout(make_batch(
        query_lens,
        context_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        device=torch.device("cpu"),
    ))
    args = (batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    out = paged_attention(*args, backend="cpu")
    ref = paged_attention(*args, backend="torch")
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert max_error(out, ref) < 2e-5
    assert max_error(out, naive_attention(batch)) < 2e-5


def test_cpu_kernel_with_two_threads_matches() -> None:
    """Items run on torch's thread pool; the result must not depend on the thread count."""
    batch = in_cpu_layout(make_batch(
        (1,) * 12 + (24,), (33, 0, 5, 80, 15, 16, 17, 1, 2, 63, 64, 65, 40),
        num_heads=9, num_kv_heads=3, head_dim=64, device=torch.device("cpu"),
    ))  # fmt: skip
    args = (batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = paged_attention(*args, backend="cpu")
    finally:
        torch.set_num_threads(before)
    one = paged_attention(*args, backend="cpu")
    assert torch.equal(one, two)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("head_dim", "block_size"), [(64, 16), (80, 16), (32, 8)])
def test_query_read_in_place_from_a_fused_projection_gives_the_same_bits(
    case: str, head_dim: int, block_size: int
) -> None:
    """The attention block hands the kernel q as a view into the fused q/k/v output (tokens
    q + 2 kv heads apart): read in place, it must give the bits of a contiguous copy on every
    path (prefill tiles, decode rows, the generic loops), and the kernel must not copy it.
    A query whose heads are not one run (a transposed view) is copied by the op and gives the same bits."""
    num_heads, num_kv_heads = 9, 3
    batch = in_cpu_layout(make_batch(*CASES[case], num_heads=num_heads, num_kv_heads=num_kv_heads,
                                     head_dim=head_dim, block_size=block_size, device=torch.device("cpu")))  # fmt: skip
    tokens, q_size = batch.query.shape[0], num_heads * head_dim
    fused = torch.randn(tokens, q_size + 2 * num_kv_heads * head_dim)
    fused[:, :q_size] = batch.query.reshape(tokens, q_size)
    view = fused[:, :q_size].view(tokens, num_heads, head_dim)
    assert not view.is_contiguous()
    rest = (batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    expected = paged_attention(batch.query.contiguous(), *rest, backend="cpu")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = paged_attention(view, *rest, backend="cpu")
    assert torch.equal(out, expected) and out.is_contiguous()
    copied = {e.key for e in prof.key_averages()} & {"aten::clone", "aten::contiguous", "aten::copy_"}
    assert not copied, f"the query was copied: {copied}"
    odd = batch.query.transpose(0, 1).contiguous().transpose(0, 1)  # heads tokens * head_dim apart
    assert odd.stride(1) != head_dim
    assert torch.equal(paged_attention(odd, *rest, backend="cpu"), expected)
    meta = batch.meta  # the compiled op itself, called with that query, copies it first
    direct = load_cpu_kernel().paged_attention(odd, batch.k_cache, batch.v_cache, meta.block_tables, meta.seq_lens,
                                               meta.query_start_loc, batch.scale, None, None)  # fmt: skip
    assert torch.equal(direct, expected)


def test_cpu_kernel_refuses_pools_in_another_layout_and_auto_falls_back() -> None:
    """The kernel reads its own pool layout only: contiguous pools are refused when "cpu" is asked
    for by name, and take the PyTorch path when the backend is chosen automatically."""
    plain = make_batch((1, 4), (20, 3), num_heads=4, num_kv_heads=2, head_dim=32, device=torch.device("cpu"))
    args = (plain.query, plain.k_cache, plain.v_cache, plain.meta, plain.scale)
    with pytest.raises(RuntimeError, match="new_kv_cache"):
        paged_attention(*args, backend="cpu")
    assert torch.equal(paged_attention(*args), paged_attention(*args, backend="torch"))
    laid_out = in_cpu_layout(plain)
    out = paged_attention(laid_out.query, laid_out.k_cache, laid_out.v_cache, laid_out.meta, laid_out.scale)
    assert not torch.equal(out, paged_attention(*args, backend="torch"))  # the kernel ran: other rounding
    assert max_error(out, naive_attention(plain)) < 2e-5


def test_cpu_kernel_rejects_other_dtypes() -> None:
    batch = make_batch((1,), (5,), num_heads=4, num_kv_heads=2, head_dim=32, dtype=torch.bfloat16,
                       device=torch.device("cpu"))  # fmt: skip
    with pytest.raises(RuntimeError, match="float32"):
        paged_attention(batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale, backend="cpu")


def _shared_prefix_decode_batch(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int) -> Batch:
    """Decode rows whose block tables share leading blocks, as a multi-turn batch's do: 0-4 share
    their first two blocks, 1-3 their first four, 1-2 six (a tree); 5 and 6 share one; 7 holds
    0's first block at another index (shared, but not as a prefix); 8 and 9 share nothing."""
    context_lens = (70, 100, 110, 75, 33, 40, 20, 50, 9, 64)
    batch = make_batch((1,) * len(context_lens), context_lens, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
                       device=torch.device("cpu"))  # fmt: skip
    tables = batch.meta.block_tables
    tables[1:5, :2] = tables[0, :2]
    tables[2:4, 2:4] = tables[1, 2:4]
    tables[2, 4:6] = tables[1, 4:6]
    tables[6, :1] = tables[5, :1]
    tables[7, 2] = tables[0, 0]
    return in_cpu_layout(batch)


def _window_starts_in_a_shared_block_batch(num_heads: int, num_kv_heads: int, head_dim: int) -> Batch:
    """Twelve decode rows; rows 0 and 1 share all their blocks but hold 100 and 103 tokens, so
    that under a window of 40 both start in their shared block 3, at keys 12 and 15 of it: a
    decode slice must not run them as one chunk there. The other ten make the batch's keys
    large enough that rows 0 and 1 stay in one slice (on one thread)."""
    context_lens = (99, 102, *range(90, 140, 5))
    batch = make_batch((1,) * len(context_lens), context_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, device=torch.device("cpu"))  # fmt: skip
    batch.meta.block_tables[1, :7] = batch.meta.block_tables[0, :7]
    return in_cpu_layout(batch)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (16, 2)])
def test_decode_rows_of_one_block_with_other_window_starts(num_heads: int, num_kv_heads: int) -> None:
    batch = _window_starts_in_a_shared_block_batch(num_heads, num_kv_heads, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        out = paged_attention(batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale, backend="cpu",
                              sliding_window=40)  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert max_error(out, naive_attention(batch, sliding_window=40)) < 2e-5


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize("block_size", [16, 8])
def test_decode_over_shared_blocks_matches_reference(num_heads: int, num_kv_heads: int, block_size: int) -> None:
    """Decode rows that share blocks are run together, each shared block read once for them."""
    batch = _shared_prefix_decode_batch(num_heads, num_kv_heads, 64, block_size)
    args = (batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    out = paged_attention(*args, backend="cpu")
    assert max_error(out, paged_attention(*args, backend="torch")) < 2e-5
    assert max_error(out, naive_attention(batch)) < 2e-5


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_row_is_bit_identical_with_or_without_sharing(threads: int) -> None:
    """A decode row's output must not depend on which other rows share its blocks (the prefix
    cache on or off must give the same tokens): each row run alone gives the same bits."""
    batch = _shared_prefix_decode_batch(9, 3, 64, 16)
    meta = batch.meta
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        together = paged_attention(batch.query, batch.k_cache, batch.v_cache, meta, batch.scale, backend="cpu")
        for s, seq_len in enumerate(meta.seq_lens_host):
            alone = dataclasses.replace(
                meta,
                query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
                seq_lens=meta.seq_lens[s : s + 1],
                block_tables=meta.block_tables[s : s + 1].contiguous(),
                slot_mapping=meta.slot_mapping[s : s + 1],
                query_lens_host=(1,),
                seq_lens_host=(seq_len,),
                max_query_len=1,
                max_seq_len=seq_len,
            )
            row = paged_attention(batch.query[s : s + 1], batch.k_cache, batch.v_cache, alone, batch.scale,
                                  backend="cpu")  # fmt: skip
            assert torch.equal(row[0], together[s]), f"row {s}"
    finally:
        torch.set_num_threads(before)


# (window, soft cap): each option alone, and both together.
OPTIONS = [(None, 2.0), (None, 30.0), *((w, None) for w in WINDOWS), (5, 30.0), (21, 2.0)]


def _options_batch(head_dim: int, num_heads: int, num_kv_heads: int, cap: float | None, block_size: int = 16) -> Batch:
    batch = make_batch(*OPTION_CASE, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       block_size=block_size, device=torch.device("cpu"))  # fmt: skip
    return batch if cap is None else with_query_gain(batch)


@pytest.mark.parametrize(("window", "cap"), OPTIONS)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (16, 2)])
@pytest.mark.parametrize(("head_dim", "block_size"), [(32, 16), (64, 16), (128, 16), (256, 16), (64, 8)])
def test_cpu_kernel_window_and_soft_cap(
    window: int | None, cap: float | None, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    """Sliding windows shorter and longer than the contexts, starting inside blocks and on their
    boundaries, and logit soft caps, for decode rows and prefill chunks over cached prefixes,
    against the fp64 reference; the blocks no query's window reaches hold NaN, so a kernel that
    read them (rather than skipping them) would fail."""
    batch = _options_batch(head_dim, num_heads, num_kv_heads, cap, block_size)
    expected = naive_attention(batch, sliding_window=window, logits_soft_cap=cap)
    poisoned = in_cpu_layout(poison_unseen_blocks(batch, window))
    out = paged_attention(poisoned.query, poisoned.k_cache, poisoned.v_cache, poisoned.meta, poisoned.scale,
                          backend="cpu", sliding_window=window, logits_soft_cap=cap)  # fmt: skip
    # float32 rounding of the scores grows with their size (the query gain in the cap cases).
    assert max_error(out, expected) < (6e-5 if cap is not None else 2e-5)


def test_cpu_kernel_options_need_a_valid_value() -> None:
    batch = in_cpu_layout(make_batch((1,), (5,), num_heads=4, num_kv_heads=2, head_dim=32, device=torch.device("cpu")))
    from batchgen.kernels.attention_cpu import load_cpu_kernel

    from .attention_cases import run_cpu_module

    with pytest.raises(RuntimeError, match="sliding_window"):
        run_cpu_module(load_cpu_kernel(), batch, sliding_window=0)
    with pytest.raises(RuntimeError, match="logits_soft_cap"):
        run_cpu_module(load_cpu_kernel(), batch, logits_soft_cap=float("inf"))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("window", "cap"), [(None, None), (40, None), (17, 30.0)])
def test_decode_row_is_bit_identical_with_or_without_sharing_under_options(
    threads: int, window: int | None, cap: float | None
) -> None:
    """The invariance of the test above holds with a sliding window and a soft cap, at GQA 8
    and head_dim 128: each row's arithmetic depends on its own window only."""
    batch = _shared_prefix_decode_batch(16, 2, 128, 16)
    meta = batch.meta
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        together = paged_attention(batch.query, batch.k_cache, batch.v_cache, meta, batch.scale, backend="cpu",
                                   sliding_window=window, logits_soft_cap=cap)  # fmt: skip
        assert max_error(together, naive_attention(batch, sliding_window=window, logits_soft_cap=cap)) < 2e-5
        for s, seq_len in enumerate(meta.seq_lens_host):
            alone = dataclasses.replace(
                meta,
                query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
                seq_lens=meta.seq_lens[s : s + 1],
                block_tables=meta.block_tables[s : s + 1].contiguous(),
                slot_mapping=meta.slot_mapping[s : s + 1],
                query_lens_host=(1,),
                seq_lens_host=(seq_len,),
                max_query_len=1,
                max_seq_len=seq_len,
            )
            row = paged_attention(batch.query[s : s + 1], batch.k_cache, batch.v_cache, alone, batch.scale,
                                  backend="cpu", sliding_window=window, logits_soft_cap=cap)  # fmt: skip
            assert torch.equal(row[0], together[s]), f"row {s}"
    finally:
        torch.set_num_threads(before)


@settings(max_examples=40)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 120)), min_size=1, max_size=5),
    heads=st.sampled_from([(4, 4), (8, 2), (9, 3), (16, 2)]),
    head_dim=st.sampled_from([32, 64, 128, 256]),
    block_size=st.sampled_from([8, 16]),
    window=st.one_of(st.none(), st.integers(1, 150)),
    cap=st.one_of(st.none(), st.floats(1.0, 60.0)),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_random_batches_with_options(
    seqs: list[tuple[int, int]],
    heads: tuple[int, int],
    head_dim: int,
    block_size: int,
    window: int | None,
    cap: float | None,
    threads: int,
    seed: int,
) -> None:
    """Any mix of decode rows and chunks over any prefixes, any window and cap, on one or two
    threads, against the fp64 reference (unseen blocks poisoned)."""
    event(f"head_dim {head_dim}")
    event("window" if window is not None else "no window")
    batch = make_batch(tuple(q for q, _ in seqs), tuple(c for _, c in seqs), num_heads=heads[0],
                       num_kv_heads=heads[1], head_dim=head_dim, block_size=block_size, seed=seed,
                       device=torch.device("cpu"))  # fmt: skip
    if cap is not None:
        batch = with_query_gain(batch)
    expected = naive_attention(batch, sliding_window=window, logits_soft_cap=cap)
    poisoned = in_cpu_layout(poison_unseen_blocks(batch, window))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = paged_attention(poisoned.query, poisoned.k_cache, poisoned.v_cache, poisoned.meta, poisoned.scale,
                              backend="cpu", sliding_window=window, logits_soft_cap=cap)  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert max_error(out, expected) < (6e-5 if cap is not None else 2e-5)
