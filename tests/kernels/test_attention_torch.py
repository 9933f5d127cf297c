"""PyTorch paged attention against the naive per-token reference (no Triton involved)."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import paged_attention, write_kv

from .attention_cases import (
    OPTION_CASE,
    WINDOWS,
    make_batch,
    max_error,
    naive_attention,
    with_query_gain,
)

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


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (16, 2)])
@pytest.mark.parametrize(
    ("window", "cap"),
    [(None, 2.0), (None, 30.0), *((w, None) for w in WINDOWS), (5, 30.0), (21, 2.0)],
)
def test_torch_path_window_and_soft_cap(
    head_dim: int, num_heads: int, num_kv_heads: int, window: int | None, cap: float | None
) -> None:
    batch = make_batch(
        *OPTION_CASE, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, device=torch.device("cpu")
    )
    if cap is not None:
        batch = with_query_gain(batch)
    out = paged_attention(
        batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale, backend="torch",
        sliding_window=window, logits_soft_cap=cap,
    )  # fmt: skip
    expected = naive_attention(batch, sliding_window=window, logits_soft_cap=cap)
    # float32 rounding of the scores grows with their size (the query gain in the cap cases).
    assert max_error(out, expected) < (4e-5 if cap is not None else 1e-5)
    if (window is not None and window < 100) or cap is not None:
        # The option matters in this case: without it the answer differs.
        assert max_error(out, naive_attention(batch)) > 1e-2


@pytest.mark.parametrize(("window", "cap"), [(0, None), (-3, None), (2.5, None), (True, None), (None, 0.0),
                                             (None, -1.0), (None, float("inf")), (None, float("nan"))])  # fmt: skip
def test_options_out_of_range_are_refused(window: object, cap: object) -> None:
    batch = make_batch((1,), (5,), num_heads=4, num_kv_heads=2, head_dim=32, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="sliding_window" if cap is None else "logits_soft_cap"):
        paged_attention(batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale,
                        sliding_window=window, logits_soft_cap=cap)  # fmt: skip
