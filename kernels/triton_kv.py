# mypy: ignore-errors
"""Triton KV write (reshape_and_cache): each token's K/V go to its pool slot.

    slot_mapping[t] = block_id * block_size + offset   ->   cache[block_id, offset, :, :]
    slot_mapping[t] = -1                                ->   token t is padding; nothing written

One program per token copies its [num_kv_heads, head_dim] K and V rows (flattened, padded to a
power of two). Mutates the caches only. Imports torch and triton only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_attention import check_launch_mode

__all__ = ["write_kv_triton"]


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_kcd,
    stride_vcb,
    stride_vcs,
    stride_vch,
    stride_vcd,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_HD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block_id = slot // BLOCK_SIZE
    in_block = slot % BLOCK_SIZE

    offs = tl.arange(0, BLOCK_HD)
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    mask = offs < NUM_KV_HEADS * HEAD_DIM

    k = tl.load(key_ptr + token * stride_kt + head * stride_kh + dim * stride_kd, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + head * stride_vh + dim * stride_vd, mask=mask)
    k_dst = block_id * stride_kcb + in_block * stride_kcs + head * stride_kch + dim * stride_kcd
    v_dst = block_id * stride_vcb + in_block * stride_vcs + head * stride_vch + dim * stride_vcd
    tl.store(k_cache_ptr + k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store key/value ([num_tokens, num_kv_heads, head_dim]) at their slots; -1 slots are skipped.

    Mutates k_cache/v_cache ([num_blocks, block_size, num_kv_heads, head_dim]); values are cast to
    the cache dtype. Raises ValueError on mismatched shapes.
    """
    if (
        key.dim() != 3
        or value.shape != key.shape
        or k_cache.dim() != 4
        or v_cache.shape != k_cache.shape
    ):
        raise ValueError(
            "expected key/value [num_tokens, num_kv_heads, head_dim] and caches "
            f"[num_blocks, block_size, num_kv_heads, head_dim]; got {tuple(key.shape)}, "
            f"{tuple(value.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    num_tokens, num_kv_heads, head_dim = key.shape
    if (num_kv_heads, head_dim) != tuple(k_cache.shape[2:]):
        raise ValueError(
            f"key heads/dim {(num_kv_heads, head_dim)} != cache {tuple(k_cache.shape[2:])}"
        )
    if slot_mapping.shape != (num_tokens,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"slot_mapping must be int32/int64 [{num_tokens}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    check_launch_mode(_write_kv_kernel, key.device)
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_HD=triton.next_power_of_2(num_kv_heads * head_dim),
        num_warps=4,
    )
