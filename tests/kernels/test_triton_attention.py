"""Triton paged attention against the PyTorch path and the naive per-token reference.

On CPU this runs under the Triton interpreter (tests/conftest.py); with BATCHGEN_REAL_GPU=1 on a
CUDA machine the same tests run the compiled kernel, plus the `gpu`-marked larger shapes.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.kernels import Backend, paged_attention, resolve_backend, write_kv
from batchgen.kernels.attention_cpu import is_cpu_kernel_available

from .attention_cases import (
    ATOL,
    CAN_RUN_TRITON,
    DEVICE,
    INTERPRETER_WARNING,
    ON_GPU,
    OPTION_CASE,
    RTOL,
    Batch,
    assert_close,
    make_batch,
    max_error,
    naive_attention,
    poison_unseen_blocks,
    with_query_gain,
)

pytest.importorskip("triton")
pytestmark = [
    pytest.mark.skipif(not CAN_RUN_TRITON, reason="needs CUDA or TRITON_INTERPRET=1"),
    pytest.mark.filterwarnings(INTERPRETER_WARNING),
]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# len 1 | decode at a block multiple (32) | decode, partial last block (37) |
# prefix ending mid-block (19) | prefix on a block boundary + full-block chunk | plain prefill
MIXED = ((1, 1, 1, 5, 16, 20), (0, 31, 36, 19, 16, 0))


def _run(batch: Batch, *, backend: Backend = "triton") -> torch.Tensor:
    out: torch.Tensor = paged_attention(
        batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale, backend=backend
    )
    return out


def _check(batch: Batch, dtype: torch.dtype) -> None:
    out = _run(batch)
    assert (
        out.shape == batch.query.shape and out.dtype == dtype and out.device == batch.query.device
    )
    assert_close(out, naive_attention(batch), dtype)
    assert_close(out, _run(batch, backend="torch"), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2)])
def test_mixed_batch(dtype: torch.dtype, head_dim: int, num_heads: int, num_kv_heads: int) -> None:
    batch = make_batch(
        *MIXED, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype
    )
    _check(batch, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_only_batch(dtype: torch.dtype) -> None:
    # All q_len 1: the launcher picks 16-row tiles (4 tokens x 4 heads here).
    batch = make_batch(
        (1, 1, 1, 1, 1), (0, 15, 16, 47, 99), num_heads=8, num_kv_heads=2, head_dim=64, dtype=dtype
    )
    _check(batch, dtype)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "query_lens", "context_lens"),
    [
        (9, 3, (1, 1, 1), (5, 40, 0)),  # group 3: 5 tokens per 16-row tile, one padding row
        (9, 3, (1, 30, 2), (21, 3, 40)),  # group 3 prefill: 21 tokens per 64-row tile
        (32, 2, (1, 3), (33, 30)),  # group 16: one token fills a 16-row decode tile
        (32, 1, (1, 1), (17, 3)),  # group 32: tile grows to 32 rows
    ],
)
def test_gqa_groups(
    num_heads: int, num_kv_heads: int, query_lens: tuple[int, ...], context_lens: tuple[int, ...]
) -> None:
    batch = make_batch(
        query_lens, context_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=32
    )
    _check(batch, torch.float32)


@pytest.mark.parametrize("block_size", [8, 32, 64])
def test_block_sizes(block_size: int) -> None:
    batch = make_batch(*MIXED, num_heads=8, num_kv_heads=2, head_dim=32, block_size=block_size)
    _check(batch, torch.float32)


def test_head_dim_128_and_long_prefix() -> None:
    batch = make_batch(
        (1, 9), (130, 77), num_heads=4, num_kv_heads=2, head_dim=128, dtype=torch.float16
    )
    _check(batch, torch.float16)


def test_strided_query_view() -> None:
    # The runner may hand over q as a view into a fused qkv projection.
    batch = make_batch(*MIXED, num_heads=4, num_kv_heads=2, head_dim=32)
    qkv = torch.randn(batch.query.shape[0], 8, 32, device=DEVICE)
    qkv[:, :4] = batch.query
    query = qkv[:, :4]
    assert not query.is_contiguous()
    out = paged_attention(
        query, batch.k_cache, batch.v_cache, batch.meta, batch.scale, backend="triton"
    )
    assert max_error(out, naive_attention(batch)) < 1e-5


def test_default_backend_follows_device() -> None:
    assert resolve_backend(None, torch.device("cuda")) == "triton"
    with pytest.raises(ValueError, match="backend"):
        resolve_backend("cuda", torch.device("cpu"))  # type: ignore[arg-type,unused-ignore]


# The compiled-GPU run (gpu-check) must not build the C++ CPU kernel: half a minute of device time.
@pytest.mark.skipif(ON_GPU, reason="CPU tier: asking builds the C++ CPU kernel")
def test_default_cpu_backend_is_the_compiled_kernel_where_it_builds() -> None:
    # On CPU the compiled kernel is the default where it builds; the PyTorch path otherwise.
    expected_cpu = "cpu" if is_cpu_kernel_available() else "torch"
    assert resolve_backend(None, torch.device("cpu")) == expected_cpu


@pytest.mark.parametrize(
    ("head_dim", "cache_dtype", "match"),
    [(320, torch.float32, "head_dim"), (32, torch.float16, "dtype")],
)
def test_rejects_unsupported_inputs(head_dim: int, cache_dtype: torch.dtype, match: str) -> None:
    batch = make_batch((2,), (3,), num_heads=2, num_kv_heads=2, head_dim=head_dim)
    with pytest.raises(ValueError, match=match):
        paged_attention(
            batch.query,
            batch.k_cache.to(cache_dtype),
            batch.v_cache.to(cache_dtype),
            batch.meta,
            batch.scale,
            backend="triton",
        )


@settings(max_examples=10, deadline=None, derandomize=True)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 24), st.integers(0, 50)), min_size=1, max_size=4),
    heads=st.sampled_from([(4, 4), (8, 2), (6, 2)]),
    block_size=st.sampled_from([8, 16]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_random_batches(
    seqs: list[tuple[int, int]],
    heads: tuple[int, int],
    block_size: int,
    dtype: torch.dtype,
    seed: int,
) -> None:
    query_lens = tuple(q for q, _ in seqs)
    context_lens = tuple(c for _, c in seqs)
    batch = make_batch(
        query_lens,
        context_lens,
        num_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=32,
        block_size=block_size,
        dtype=dtype,
        seed=seed,
    )
    assert_close(_run(batch), naive_attention(batch), dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device and BATCHGEN_REAL_GPU=1")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (32, 8, 128)])
def test_gpu_larger_shapes(
    dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    # Long decodes next to prefill chunks with and without cached prefixes; native bf16 tl.dot.
    query_lens = (1,) * 12 + (64, 200, 130, 1)
    context_lens = (2047, 511, 100, 1000, 0, 15, 16, 17, 700, 1500, 63, 64, 0, 1024, 33, 3000)
    batch = make_batch(
        query_lens,
        context_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
    )
    reference = paged_attention(
        batch.query.float(),
        batch.k_cache.float(),
        batch.v_cache.float(),
        batch.meta,
        batch.scale,
        backend="torch",
    )
    assert_close(_run(batch), reference, dtype)


def test_write_then_attend() -> None:
    # The engine's order: store the chunk's K/V through slot_mapping, then attend over the pool.
    batch = make_batch(*MIXED, num_heads=8, num_kv_heads=2, head_dim=32, dtype=torch.float16)
    expected = naive_attention(batch)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    flat_k, flat_v = k_cache.view(-1, 2, 32), v_cache.view(-1, 2, 32)
    flat_k[batch.meta.slot_mapping] = 0
    flat_v[batch.meta.slot_mapping] = 0
    write_kv(batch.key, batch.value, k_cache, v_cache, batch.meta.slot_mapping, backend="triton")
    out = paged_attention(batch.query, k_cache, v_cache, batch.meta, batch.scale, backend="triton")
    assert_close(out, expected, torch.float16)


# Few cases per variant: the interpreter runs every program of every tile in Python. Together
# they cover GQA 1, 4 and 8, head_dim 32, 96 (padded to 128 lanes), 128 and 256 (the narrow
# tiles), windows inside a block, on a block boundary and across blocks and the tiles of 32 keys,
# and caps. The batch is OPTION_CASE less its two shortest sequences: decode rows at a block
# multiple and far past the windows, a chunk over a prefix that ends mid-block, a chunk longer
# than most windows over a prefix.
TRITON_OPTION_CASE = (OPTION_CASE[0][1:5], OPTION_CASE[1][1:5])
OPTION_VARIANTS = [
    # (num_heads, num_kv_heads, head_dim, dtype, window, cap)
    (8, 2, 32, torch.float32, 5, None),
    (8, 2, 32, torch.float32, 21, None),
    (8, 2, 32, torch.float32, None, 2.0),
    (8, 2, 32, torch.float16, 21, 30.0),
    (16, 2, 128, torch.float32, 16, 30.0),
    (2, 2, 256, torch.float32, 5, 2.0),
    (4, 2, 96, torch.float32, 21, None),
    (4, 2, 96, torch.bfloat16, None, None),
]


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "dtype", "window", "cap"), OPTION_VARIANTS, ids=str
)
def test_window_soft_cap_and_head_dims(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, window: int | None, cap: float | None
) -> None:
    """Against the fp64 reference and the PyTorch path; the blocks of key tiles wholly before
    every window hold NaN, so a kernel that visited those tiles (even masked) would fail."""
    batch = make_batch(*TRITON_OPTION_CASE, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       dtype=dtype)  # fmt: skip
    if cap is not None:
        batch = with_query_gain(batch)
    expected = naive_attention(batch, sliding_window=window, logits_soft_cap=cap)
    tile = 16 if head_dim > 128 else 32
    poisoned = poison_unseen_blocks(batch, window, key_tile=tile)
    out = paged_attention(poisoned.query, poisoned.k_cache, poisoned.v_cache, poisoned.meta, poisoned.scale,
                          backend="triton", sliding_window=window, logits_soft_cap=cap)  # fmt: skip
    assert out.shape == batch.query.shape and out.dtype == dtype
    # float32 rounding of the scores grows with their size (the query gain in the cap cases).
    gain = 4.0 if cap is not None and dtype == torch.float32 else 1.0
    torch.testing.assert_close(out.double().cpu(), expected, atol=ATOL[dtype] * gain, rtol=RTOL[dtype])
    reference = paged_attention(batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale,
                                backend="torch", sliding_window=window, logits_soft_cap=cap)  # fmt: skip
    torch.testing.assert_close(out.double().cpu(), reference.double().cpu(), atol=ATOL[dtype] * gain,
                               rtol=RTOL[dtype])  # fmt: skip
