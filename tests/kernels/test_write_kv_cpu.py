"""The compiled CPU KV write against an explicit per-slot copy; must be exact."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import new_kv_cache, write_kv
from batchgen.kernels.attention_cpu import (
    cpu_kv_cache,
    is_cpu_kernel_available,
    is_cpu_kv_layout,
    write_kv_cpu,
)

pytestmark = pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")


def _expected(cache: torch.Tensor, new: torch.Tensor, slots: list[int]) -> torch.Tensor:
    out = cache.clone()
    block_size = cache.shape[1]
    for token, slot in enumerate(slots):
        if slot >= 0:
            out[slot // block_size, slot % block_size] = new[token]
    return out


def _pools(layout: str, shape: tuple[int, int, int, int], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random pools, contiguous or in the compiled kernel's strided layout."""
    if layout == "plain":
        return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    k_cache, v_cache = cpu_kv_cache(*shape)
    k_cache.copy_(torch.randn(shape, generator=gen))
    v_cache.copy_(torch.randn(shape, generator=gen))
    assert is_cpu_kv_layout(k_cache, v_cache)
    return k_cache, v_cache


@pytest.mark.parametrize("layout", ["plain", "kernel"])
@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(2, 32, 16), (3, 64, 8)])
def test_write_kv_from_a_fused_projection_is_exact_and_skips_padding(
    num_kv_heads: int, head_dim: int, block_size: int, layout: str
) -> None:
    gen = torch.Generator().manual_seed(1)
    num_blocks = 6
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = _pools(layout, shape, gen)
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


@pytest.mark.parametrize("layout", ["plain", "kernel"])
def test_the_pytorch_write_is_exact_in_either_layout(layout: str) -> None:
    gen = torch.Generator().manual_seed(2)
    shape = (4, 8, 3, 16)
    k_cache, v_cache = _pools(layout, shape, gen)
    slots = [9, 0, 31, 17]
    key, value = torch.randn(4, 3, 16, generator=gen), torch.randn(4, 3, 16, generator=gen)
    expected_k, expected_v = _expected(k_cache, key, slots), _expected(v_cache, value, slots)
    write_kv(key, value, k_cache, v_cache, torch.tensor(slots), backend="torch")
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    assert is_cpu_kv_layout(k_cache, v_cache) is (layout == "kernel")  # written in place


def test_new_kv_cache_lays_out_for_the_backend() -> None:
    cpu = torch.device("cpu")
    k_cache, v_cache = new_kv_cache(3, 16, 2, 32, dtype=torch.float32, device=cpu, backend="cpu")
    assert is_cpu_kv_layout(k_cache, v_cache) and k_cache.shape == (3, 16, 2, 32)
    k_cache, v_cache = new_kv_cache(3, 16, 2, 32, dtype=torch.float32, device=cpu, backend="torch")
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape == (3, 16, 2, 32)
    k_cache, _ = new_kv_cache(3, 16, 2, 32, dtype=torch.bfloat16, device=cpu, backend="cpu")
    assert k_cache.is_contiguous()  # the compiled kernel is float32 only


def test_write_kv_refuses_a_slot_outside_the_pool() -> None:
    k_cache, v_cache = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    new = torch.ones(2, 1, 8)
    with pytest.raises(RuntimeError, match="slot 8 is outside the pool of 8"):
        write_kv_cpu(new, new, k_cache, v_cache, torch.tensor([0, 8]))
    with pytest.raises(RuntimeError, match="slot -2"):
        write_kv_cpu(new, new, k_cache, v_cache, torch.tensor([-2, 1]))
    assert not k_cache.any()  # checked before anything is written
