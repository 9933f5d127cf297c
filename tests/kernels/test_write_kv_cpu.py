"""The compiled CPU KV write against an explicit per-slot copy; must be exact."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import write_kv
from batchgen.kernels.attention_cpu import is_cpu_kernel_available, write_kv_cpu

pytestmark = pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")


def _expected(cache: torch.Tensor, new: torch.Tensor, slots: list[int]) -> torch.Tensor:
    out = cache.clone()
    block_size = cache.shape[1]
    for token, slot in enumerate(slots):
        if slot >= 0:
            out[slot // block_size, slot % block_size] = new[token]
    return out


@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(2, 32, 16), (3, 64, 8)])
def test_write_kv_from_a_fused_projection_is_exact_and_skips_padding(
    num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    gen = torch.Generator().manual_seed(1)
    num_blocks = 6
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    last = num_blocks * block_size - 1
    slots = [3 * block_size + 5, 3 * block_size + 6, -1, block_size, 0, last, -1, 5 * block_size + 1]
    kv = num_kv_heads * head_dim
    qkv = torch.randn(len(slots), 4 * head_dim + 2 * kv, generator=gen)  # K and V are strided views
    key = qkv[:, 4 * head_dim : 4 * head_dim + kv].view(len(slots), num_kv_heads, head_dim)
    value = qkv[:, 4 * head_dim + kv :].view(len(slots), num_kv_heads, head_dim)
    expected_k, expected_v = _expected(k_cache, key, slots), _expected(v_cache, value, slots)
    write_kv(key, value, k_cache, v_cache, torch.tensor(slots), backend="cpu")
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


def test_write_kv_refuses_a_slot_outside_the_pool() -> None:
    k_cache, v_cache = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    new = torch.ones(2, 1, 8)
    with pytest.raises(RuntimeError, match="slot 8 is outside the pool of 8"):
        write_kv_cpu(new, new, k_cache, v_cache, torch.tensor([0, 8]))
    with pytest.raises(RuntimeError, match="slot -2"):
        write_kv_cpu(new, new, k_cache, v_cache, torch.tensor([-2, 1]))
    assert not k_cache.any()  # checked before anything is written
