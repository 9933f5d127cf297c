"""PyTorch paged attention against the naive per-token reference (no Triton involved)."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import paged_attention, write_kv

from .attention_cases import make_batch, max_error, naive_attention

# (query_lens, context_lens): each entry names what it covers.
CASES = {
    # len 1 | decode at a block multiple (32) | decode, partial last block (37) |
    # prefix ending mid-block (19) | prefix on a block boundary + full-block chunk | plain prefill
    "mixed": ((1, 1, 1, 5, 16, 20), (0, 31, 36, 19, 16, 0)),
    "decode_only": ((1, 1, 1, 1), (0, 15, 16, 70)),
    "prefill_only": ((3, 17, 32), (0, 5, 0)),
}
HEADS = [(4, 4), (8, 2), (9, 3)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize("head_dim", [32, 64])
def test_torch_path_matches_naive(
    case: str, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    query_lens, context_lens = CASES[case]
    batch = make_batch(
        query_lens,
        context_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        device=torch.device("cpu"),
    )
    out = paged_attention(
        batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale, backend="torch"
    )
    assert out.shape == batch.query.shape and out.dtype == torch.float32
    assert max_error(out, naive_attention(batch)) < 1e-5


@pytest.mark.parametrize("block_size", [8, 32])
def test_torch_path_other_block_sizes(block_size: int) -> None:
    query_lens, context_lens = CASES["mixed"]
    batch = make_batch(
        query_lens,
        context_lens,
        num_heads=8,
        num_kv_heads=2,
        head_dim=32,
        block_size=block_size,
        device=torch.device("cpu"),
    )
    out = paged_attention(batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert max_error(out, naive_attention(batch)) < 1e-5


def test_torch_write_kv_stores_at_slots() -> None:
    batch = make_batch(
        (3, 1), (14, 4), num_heads=4, num_kv_heads=2, head_dim=32, device=torch.device("cpu")
    )
    k_cache = torch.zeros_like(batch.k_cache)
    v_cache = torch.zeros_like(batch.v_cache)
    write_kv(batch.key, batch.value, k_cache, v_cache, batch.meta.slot_mapping, backend="torch")
    slots = batch.meta.slot_mapping
    assert torch.equal(k_cache.view(-1, 2, 32)[slots], batch.key)
    assert torch.equal(v_cache.view(-1, 2, 32)[slots], batch.value)
    assert int((k_cache != 0).any(dim=(2, 3)).sum()) == len(slots)
