"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2) over a flat batch of tokens.

Projections, MLP and norms run over all of a step's tokens together; attention reads each
sequence's K/V through its block table (batchgen.kernels). Q/K/V and gate/up are fused into
one matrix each at load. The KV pool tensors are owned by the runner and passed in.
"""

from __future__ import annotations

import math
from typing import TypeAlias

import torch

from batchgen.kernels import (
    AttentionMetadata,
    Backend,
    PackedLinear,
    keep_freed_memory,
    linear,
    pack_linear_weight,
    packed_linear_library,
    paged_attention,
    prepare_backend,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
    write_kv,
)

from .config import ModelConfig, RopeScaling

# A projection's weight: plain [out, in], or packed once for the CPU (kernels/linear_cpu.py).
Weight: TypeAlias = torch.Tensor | PackedLinear

__all__ = ["LlamaModel", "rope_inv_freq"]


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse frequencies (float32, [head_dim // 2]) with llama3 or linear scaling applied."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None or scaling.rope_type in ("default", ""):
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        old_len = scaling.original_max_position_embeddings
        low_wavelen = old_len / scaling.low_freq_factor
        high_wavelen = old_len / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_scaling type {scaling.rope_type!r}")


class _Layer:
    __slots__ = ("down", "gate_up", "input_norm", "o_proj", "post_norm", "qkv", "qkv_bias")

    def __init__(
        self,
        qkv: Weight,
        qkv_bias: torch.Tensor | None,
        o_proj: Weight,
        gate_up: Weight,
        down: Weight,
        input_norm: torch.Tensor,
        post_norm: torch.Tensor,
    ) -> None:
        self.qkv = qkv
        self.qkv_bias = qkv_bias
        self.o_proj = o_proj
        self.gate_up = gate_up
        self.down = down
        self.input_norm = input_norm
        self.post_norm = post_norm


class LlamaModel:
    """Weights plus a forward pass; holds no per-step state."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        attention_backend: Backend | None = None,
    ) -> None:
        self.config = config
        self.device = device
        self.dtype = dtype
        self._backend = attention_backend

        def take(name: str) -> torch.Tensor:
            if name not in weights:
                raise KeyError(f"checkpoint is missing tensor {name!r}")
            return weights[name].to(device=device, dtype=dtype).contiguous()

        self.embed = take("model.embed_tokens.weight")
        self.norm = take("model.norm.weight")
        self.lm_head: Weight = self.embed if config.tie_word_embeddings else take("lm_head.weight")
        self.layers: list[_Layer] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            qkv = torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"], dim=0)
            bias = None
            if config.qkv_bias:
                bias = torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"], dim=0)
            gate_up = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")], dim=0)
            self.layers.append(
                _Layer(
                    qkv=qkv,
                    qkv_bias=bias,
                    o_proj=take(p + "self_attn.o_proj.weight"),
                    gate_up=gate_up,
                    down=take(p + "mlp.down_proj.weight"),
                    input_norm=take(p + "input_layernorm.weight"),
                    post_norm=take(p + "post_attention_layernorm.weight"),
                )
            )
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        freqs = torch.outer(torch.arange(max_model_len, dtype=torch.float32), inv_freq)
        # float32 tables [max_model_len, head_dim / 2]; the rotation rounds once to the q/k dtype.
        self._cos = freqs.cos().to(device=device)
        self._sin = freqs.sin().to(device=device)
        self._scale = config.head_dim**-0.5
        prepare_backend(attention_backend, device)  # the CPU kernel's build, here, not in a first step
        if device.type == "cpu":
            keep_freed_memory()  # each layer's large activations reuse freed heap, not fresh pages
        # On CPU in float32 the projections run with weights packed once (MKL's packed sgemm,
        # kernels/linear_cpu.py); the "torch" backend keeps F.linear, the reference path.
        self.packed_linear = (
            device.type == "cpu" and dtype == torch.float32 and attention_backend != "torch" and packed_linear_library() is not None
        )
        if self.packed_linear:
            for layer in self.layers:
                layer.qkv = pack_linear_weight(layer.qkv)
                layer.o_proj = pack_linear_weight(layer.o_proj)
                layer.gate_up = pack_linear_weight(layer.gate_up)
                layer.down = pack_linear_weight(layer.down)
            self.lm_head = pack_linear_weight(self.lm_head)  # a copy when tied: embed stays plain

    @property
    def attention_backend(self) -> Backend | None:
        """The attention backend asked for (None: chosen per call from the device and dtype)."""
        return self._backend

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.config
        return 2 * c.num_layers * c.num_kv_heads * c.head_dim * self.embed.element_size()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (float32, [len(logits_indices), vocab]) of the selected tokens.

        Writes each layer's new K/V into kv_caches at meta.slot_mapping.
        """
        c = self.config
        backend = self._backend
        num_tokens = input_ids.shape[0]
        q_size = c.num_heads * c.head_dim
        kv_size = c.num_kv_heads * c.head_dim
        hidden = self.embed.index_select(0, input_ids)
        residual: torch.Tensor | None = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            # The residual add is fused into the norm: residual <- hidden + residual.
            x, residual = rms_norm(hidden, layer.input_norm, c.rms_norm_eps, residual, backend=backend)
            qkv = linear(x, layer.qkv, layer.qkv_bias)
            q = qkv[:, :q_size].view(num_tokens, c.num_heads, c.head_dim)
            k = qkv[:, q_size : q_size + kv_size].view(num_tokens, c.num_kv_heads, c.head_dim)
            v = qkv[:, q_size + kv_size :].view(num_tokens, c.num_kv_heads, c.head_dim)
            rotary_embedding(positions, q, k, self._cos, self._sin, backend=backend)
            # Every token's K/V is written before any attention reads the pool: a sequence
            # admitted this step may read blocks another one fills in this same step.
            write_kv(k, v, k_cache, v_cache, meta.slot_mapping, backend=backend)
            attn = paged_attention(q, k_cache, v_cache, meta, self._scale, backend=backend)
            hidden = linear(attn.reshape(num_tokens, q_size), layer.o_proj)
            x, residual = rms_norm(hidden, layer.post_norm, c.rms_norm_eps, residual, backend=backend)
            hidden = linear(silu_and_mul(linear(x, layer.gate_up), backend=backend), layer.down)
        if residual is None:
            raise RuntimeError("the model has no layers")
        last, _ = rms_norm(
            hidden.index_select(0, logits_indices),
            self.norm,
            c.rms_norm_eps,
            residual.index_select(0, logits_indices),
            backend=backend,
        )
        logits: torch.Tensor = linear(last, self.lm_head).float()
        return logits
