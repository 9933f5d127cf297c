# mypy: ignore-errors
"""Triton RMSNorm with fused residual add, and rotary embedding applied in place.

RMSNorm follows Hugging Face Llama's rounding so greedy parity holds in 16-bit dtypes:

    h        = x + residual                      (rounded to x.dtype; h = x without a residual)
    out      = weight * (h_f32 * rsqrt(mean(h_f32^2) + eps)).to(x.dtype)

Rotary embedding is the NeoX / Hugging Face "rotate_half" form over the whole head, computed in
fp32 and rounded once:

    | x1 = x[:D/2] | x2 = x[D/2:] |  ->  | x1*cos - x2*sin | x2*cos + x1*sin |

with cos/sin = cos_cache[pos], sin_cache[pos] ([max_positions, D/2]). One program per token.
Imports torch and triton only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_attention import check_launch_mode

__all__ = ["rms_norm_triton", "rotary_embedding_triton"]


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    res_out_ptr,
    x_ptr,
    res_ptr,
    w_ptr,
    eps,
    hidden,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    h = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        h = (h.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(hf * hf, axis=0) / hidden + eps)
    normed = (hf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, new_residual) for x [num_tokens, hidden]; new_residual is x itself without a residual.

    Writes new tensors only. Raises ValueError on mismatched shapes.
    """
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(
            f"expected x [num_tokens, hidden] and weight [hidden]; got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual {residual.dtype} {tuple(residual.shape)} must match x {x.dtype} {tuple(x.shape)}"
        )
    check_launch_mode(_rms_norm_kernel, x.device)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    new_residual = x if residual is None else torch.empty_like(out)
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return out, new_residual
    block = triton.next_power_of_2(hidden)
    res = residual if residual is not None else x
    _rms_norm_kernel[(num_tokens,)](
        out,
        new_residual,
        x,
        res,
        weight.contiguous(),
        eps,
        hidden,
        x.stride(0),
        res.stride(0),
        out.stride(0),
        new_residual.stride(0),
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=min(max(block // 256, 1), 16),
    )
    return out, new_residual


@triton.jit
def _rotate_heads(
    x_ptr,
    token,
    stride_t,
    stride_h,
    stride_d,
    num_heads,
    cos,
    sin,
    BLOCK_H: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PADDED: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HALF_PADDED)
    mask = (offs_h < num_heads)[:, None]
    if HALF_PADDED != HALF:
        mask = mask & (offs_d < HALF)[None, :]
    ptr1 = x_ptr + token * stride_t + offs_h[:, None] * stride_h + offs_d[None, :] * stride_d
    ptr2 = ptr1 + HALF * stride_d
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr2, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr1, (x1 * cos[None, :] - x2 * sin[None, :]).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr2, (x2 * cos[None, :] + x1 * sin[None, :]).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    num_heads,
    num_kv_heads,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_cos,
    stride_sin,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PADDED: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, HALF_PADDED)
    d_mask = offs_d < HALF
    cos = tl.load(cos_ptr + pos * stride_cos + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_sin + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr, token, stride_qt, stride_qh, stride_qd, num_heads, cos, sin, BLOCK_H, HALF, HALF_PADDED
    )
    _rotate_heads(
        k_ptr, token, stride_kt, stride_kh, stride_kd, num_kv_heads, cos, sin, BLOCK_KV, HALF, HALF_PADDED
    )


def rotary_embedding_triton(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
) -> None:
    """Rotate query [T, H, D] and key [T, KVH, D] in place (views with any strides are fine).

    positions: int [T]; cos_cache/sin_cache: [max_positions, D/2]. Any even head_dim (a half that
    is no power of two, as Phi-3's 48, is padded to one and masked). Raises ValueError on bad
    shapes or an odd head_dim.
    """
    if (
        query.dim() != 3
        or key.dim() != 3
        or query.shape[0] != key.shape[0]
        or query.shape[2] != key.shape[2]
    ):
        raise ValueError(
            f"expected query [T, H, D] and key [T, KVH, D]; got {tuple(query.shape)}, {tuple(key.shape)}"
        )
    num_tokens, num_heads, head_dim = query.shape
    half = head_dim // 2
    if half < 1 or head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head_dim >= 2, got {head_dim}")
    if positions.shape != (num_tokens,):
        raise ValueError(f"positions must be [{num_tokens}], got {tuple(positions.shape)}")
    if cos_cache.dim() != 2 or cos_cache.shape[1] != half or sin_cache.shape != cos_cache.shape:
        raise ValueError(
            f"cos/sin caches must be [max_positions, {half}]; got {tuple(cos_cache.shape)}, {tuple(sin_cache.shape)}"
        )
    check_launch_mode(_rotary_kernel, query.device)
    if num_tokens == 0:
        return
    cos_cache = cos_cache if cos_cache.stride(1) == 1 else cos_cache.contiguous()
    sin_cache = sin_cache if sin_cache.stride(1) == 1 else sin_cache.contiguous()
    _rotary_kernel[(num_tokens,)](
        query,
        key,
        positions,
        cos_cache,
        sin_cache,
        num_heads,
        key.shape[1],
        *query.stride(),
        *key.stride(),
        cos_cache.stride(0),
        sin_cache.stride(0),
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_KV=triton.next_power_of_2(key.shape[1]),
        HALF=half,
        HALF_PADDED=triton.next_power_of_2(half),
        num_warps=4,
    )
