"""The attention block every family builds its layers from, and what a step hands each block.

One `Attention` holds one layer's fused q/k/v projection (rows `| q | k | v |`, optional bias),
the optional per-head q/k RMSNorm, its rotary table (None: a layer without rotary embedding),
its sliding window and logit soft cap, and the output projection. Its forward writes the step's
K/V into the layer's pool and reads the pool through `batchgen.kernels.paged_attention`; it keeps
no state between steps.

Imports torch and `batchgen.kernels`.
"""

from __future__ import annotations

from typing import NamedTuple, TypeAlias

import torch

from batchgen.kernels import (
    AttentionMetadata,
    Backend,
    PackedLinear,
    linear,
    pack_linear_weight,
    paged_attention,
    rms_norm,
    rotary_embedding,
    write_kv,
)

from .rope import RotaryTable

__all__ = ["Attention", "StepInputs", "Weight", "pack"]

# A projection's weight: plain [out, in], or packed once for the CPU (kernels/linear_cpu.py).
Weight: TypeAlias = torch.Tensor | PackedLinear


def pack(weight: Weight, compute_dtype: torch.dtype = torch.float32) -> PackedLinear:
    """`weight` packed for the CPU's linear layers, products in `compute_dtype` (float32 or
    bfloat16; a packed one is returned as it is)."""
    return weight if isinstance(weight, PackedLinear) else pack_linear_weight(weight, compute_dtype=compute_dtype)


class StepInputs(NamedTuple):
    """What every block of one forward pass reads: token positions (int64 [T]), the attention
    metadata and the backend asked for (None: chosen by device and dtype)."""

    positions: torch.Tensor
    meta: AttentionMetadata
    backend: Backend | None


class Attention:
    """One layer's self-attention over the paged KV cache (see module docstring)."""

    __slots__ = (
        "head_dim", "k_norm", "norm_eps", "num_heads", "num_kv_heads", "o_bias", "o_proj", "q_norm",
        "qkv", "qkv_bias", "rope", "scale", "sliding_window", "soft_cap",
    )  # fmt: skip

    def __init__(
        self,
        *,
        qkv: Weight,
        qkv_bias: torch.Tensor | None,
        o_proj: Weight,
        o_bias: torch.Tensor | None,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        rope: RotaryTable | None,
        q_norm: torch.Tensor | None = None,
        k_norm: torch.Tensor | None = None,
        norm_eps: float = 1e-6,
        sliding_window: int | None = None,
        soft_cap: float | None = None,
    ) -> None:
        self.qkv = qkv
        self.qkv_bias = qkv_bias
        self.o_proj = o_proj
        self.o_bias = o_bias
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.rope = rope
        self.q_norm = q_norm
        self.k_norm = k_norm
        self.norm_eps = norm_eps
        self.sliding_window = sliding_window
        self.soft_cap = soft_cap

    def pack(self, compute_dtype: torch.dtype = torch.float32) -> None:
        """Pack the projections for the CPU's linear layers (mutates this block)."""
        self.qkv = pack(self.qkv, compute_dtype)
        self.o_proj = pack(self.o_proj, compute_dtype)

    def forward(self, x: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], step: StepInputs) -> torch.Tensor:
        """Output [T, hidden] for normed hidden states x [T, hidden]; writes this step's K/V into
        `kv_cache` at `step.meta.slot_mapping` before attention reads the pool (a sequence admitted
        this step may read blocks another fills in this same step)."""
        num_tokens, head_dim, backend = x.shape[0], self.head_dim, step.backend
        q_size, kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        qkv = linear(x, self.qkv, self.qkv_bias)
        q = qkv[:, :q_size].view(num_tokens, self.num_heads, head_dim)
        k = qkv[:, q_size : q_size + kv_size].view(num_tokens, self.num_kv_heads, head_dim)
        v = qkv[:, q_size + kv_size :].view(num_tokens, self.num_kv_heads, head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = rms_norm(q.reshape(-1, head_dim), self.q_norm, self.norm_eps, backend=backend).out.view(q.shape)
            k = rms_norm(k.reshape(-1, head_dim), self.k_norm, self.norm_eps, backend=backend).out.view(k.shape)
        if self.rope is not None:
            rotary_embedding(step.positions, q, k, self.rope.cos, self.rope.sin, backend=backend)
        k_cache, v_cache = kv_cache
        write_kv(k, v, k_cache, v_cache, step.meta.slot_mapping, backend=backend)
        attn = paged_attention(
            q, k_cache, v_cache, step.meta, self.scale, backend=backend,
            sliding_window=self.sliding_window, logits_soft_cap=self.soft_cap,
        )  # fmt: skip
        out: torch.Tensor = linear(attn.reshape(num_tokens, q_size), self.o_proj, self.o_bias)
        return out
