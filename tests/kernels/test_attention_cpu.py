"""The compiled CPU paged-attention kernel against the PyTorch reference path.

The first test in a fresh environment builds the extension (tens of seconds, then cached).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from batchgen.kernels import paged_attention
from batchgen.kernels.attention_cpu import is_cpu_kernel_available

from .attention_cases import Batch, in_cpu_layout, make_batch, max_error, naive_attention

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
HEADS = [(4, 4), (8, 2), (9, 3)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize(("head_dim", "block_size"), [(32, 16), (64, 16), (64, 8)])
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
