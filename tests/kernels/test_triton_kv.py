"""Triton KV write (reshape_and_cache) against an explicit per-slot copy; must be exact."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import write_kv

from .attention_cases import CAN_RUN_TRITON, DEVICE, INTERPRETER_WARNING

pytest.importorskip("triton")
pytestmark = [
    pytest.mark.skipif(not CAN_RUN_TRITON, reason="needs CUDA or TRITON_INTERPRET=1"),
    pytest.mark.filterwarnings(INTERPRETER_WARNING),
]


def _expected(cache: torch.Tensor, new: torch.Tensor, slots: list[int]) -> torch.Tensor:
    out = cache.clone()
    block_size = cache.shape[1]
    for token, slot in enumerate(slots):
        if slot >= 0:
            out[slot // block_size, slot % block_size] = new[token].to(cache.dtype)
    return out

def _write_and_check(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: list[int],
    slot_dtype: torch.dtype,
) -> None:
    """Triton write_kv on copies of the caches equals the expected pools; -1 slots untouched."""
    expected_k = _expected(k_cache, key, slots)
    expected_v = _expected(v_cache, value, slots)
    k_dev, v_dev = k_cache.to(DEVICE), v_cache.to(DEVICE)
    slot_mapping = torch.tensor(slots, dtype=slot_dtype, device=DEVICE)
    write_kv(key.to(DEVICE), value.to(DEVICE), k_dev, v_dev, slot_mapping, backend="triton")
    assert torch.equal(k_dev.cpu(), expected_k)
    assert torch.equal(v_dev.cpu(), expected_v)



@pytest.mark.parametrize(
    ("cache_dtype", "input_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float32),  # cast on store, as the PyTorch path does
    ],
    ids=str,
)
@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(2, 32, 16), (3, 64, 8)])
def test_write_kv_exact_and_skips_padding(
    cache_dtype: torch.dtype,
    input_dtype: torch.dtype,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
) -> None:
    gen = torch.Generator().manual_seed(1)
    num_blocks = 6
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(
        cache_dtype
    )
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(
        cache_dtype
    )
    # Scattered slots, a mid-block run, the pool's last slot, and two -1 padding tokens.
    last = num_blocks * block_size - 1
    slots = [
        3 * block_size + 5,
        3 * block_size + 6,
        -1,
        block_size,
        0,
        last,
        -1,
        5 * block_size + 1,
    ]
    key = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(input_dtype)
    value = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(input_dtype)
    _write_and_check(key, value, k_cache, v_cache, slots, torch.int64)


def test_write_kv_strided_input_and_int32_slots() -> None:
    # K and V as views into one fused projection output, slots as int32.
    gen = torch.Generator().manual_seed(2)
    kv = torch.randn(5, 2, 2, 32, generator=gen)
    key, value = kv[:, 0], kv[:, 1]
    k_cache = torch.zeros(4, 16, 2, 32)
    v_cache = torch.zeros(4, 16, 2, 32)
    slots = [17, 18, 40, -1, 63]
    _write_and_check(key, value, k_cache, v_cache, slots, torch.int32)


def test_write_kv_rejects_mismatched_shapes() -> None:
    k_cache = torch.zeros(2, 16, 2, 32, device=DEVICE)
    key = torch.zeros(3, 4, 32, device=DEVICE)
    with pytest.raises(ValueError, match="cache"):
        write_kv(
            key,
            key,
            k_cache,
            k_cache.clone(),
            torch.zeros(3, dtype=torch.int64, device=DEVICE),
            backend="triton",
        )
