"""Decoder layers: an attention block and a feed-forward block between RMSNorms.

The residual stream is carried as (hidden, residual), and each norm's residual add is fused into
it (`rms_norm(x, w, eps, residual)` returns `norm(x + residual)` and `x + residual`); the first
layer gets residual None. Two arrangements:

    PreNormLayer (Llama, Qwen, Mistral, Phi-3, SmolLM3, Mixtral):
        r = r + attn(norm(r));  r = r + mlp(norm(r))
    SandwichLayer (Gemma 2 / 3): each block's output is normed before it joins the residual:
        r = r + norm(attn(norm(r)));  r = r + norm(mlp(norm(r)))

Imports torch and `batchgen.kernels`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from batchgen.kernels import rms_norm

from .attention import Attention, StepInputs
from .mlp import DenseMLP, MoEMLP

__all__ = ["DecoderLayer", "PreNormLayer", "SandwichLayer"]


class DecoderLayer(Protocol):
    attention: Attention
    mlp: DenseMLP | MoEMLP

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        step: StepInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's output, the residual it adds to); see the module docstring."""
        ...

    def pack(self, compute_dtype: torch.dtype = torch.float32) -> None:
        """Pack the projections for the CPU's linear layers, products in `compute_dtype` (mutates
        the layer)."""
        ...


class PreNormLayer:
    __slots__ = ("attention", "eps", "input_norm", "mlp", "post_attention_norm")

    def __init__(
        self,
        attention: Attention,
        mlp: DenseMLP | MoEMLP,
        *,
        input_norm: torch.Tensor,
        post_attention_norm: torch.Tensor,
        eps: float,
    ) -> None:
        self.attention = attention
        self.mlp = mlp
        self.input_norm = input_norm
        self.post_attention_norm = post_attention_norm
        self.eps = eps

    def pack(self, compute_dtype: torch.dtype = torch.float32) -> None:
        self.attention.pack(compute_dtype)
        self.mlp.pack(compute_dtype)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        step: StepInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        backend = step.backend
        x, residual = rms_norm(hidden, self.input_norm, self.eps, residual, backend=backend)
        hidden = self.attention.forward(x, kv_cache, step)
        x, residual = rms_norm(hidden, self.post_attention_norm, self.eps, residual, backend=backend)
        return self.mlp.forward(x, backend), residual


class SandwichLayer:
    __slots__ = (
        "attention", "eps", "input_norm", "mlp", "post_attention_norm", "post_feedforward_norm",
        "pre_feedforward_norm",
    )  # fmt: skip

    def __init__(
        self,
        attention: Attention,
        mlp: DenseMLP | MoEMLP,
        *,
        input_norm: torch.Tensor,
        post_attention_norm: torch.Tensor,
        pre_feedforward_norm: torch.Tensor,
        post_feedforward_norm: torch.Tensor,
        eps: float,
    ) -> None:
        self.attention = attention
        self.mlp = mlp
        self.input_norm = input_norm
        self.post_attention_norm = post_attention_norm
        self.pre_feedforward_norm = pre_feedforward_norm
        self.post_feedforward_norm = post_feedforward_norm
        self.eps = eps

    def pack(self, compute_dtype: torch.dtype = torch.float32) -> None:
        self.attention.pack(compute_dtype)
        self.mlp.pack(compute_dtype)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        step: StepInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        backend, eps = step.backend, self.eps
        x, residual = rms_norm(hidden, self.input_norm, eps, residual, backend=backend)
        hidden = rms_norm(self.attention.forward(x, kv_cache, step), self.post_attention_norm, eps, backend=backend).out
        x, residual = rms_norm(hidden, self.pre_feedforward_norm, eps, residual, backend=backend)
        return rms_norm(self.mlp.forward(x, backend), self.post_feedforward_norm, eps, backend=backend).out, residual
