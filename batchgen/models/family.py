"""What a model family module provides, and the shared pieces the family modules build from.

A family (`llama.py`, `qwen3.py`, `gemma.py`, `phi3.py`, `smollm3.py`, `mixtral.py`) is a
`Family`: the architecture names it serves (`ModelConfig.architecture`), the weight names and
shapes a checkpoint of a config holds (Hugging Face names), and a `build` that turns a
config and its weights into `ModelParts` made of the shared blocks (`attention`, `mlp`,
`layers`). `registry` maps each architecture name to its family; `decoder.DecoderModel` runs the
parts. Everything that differs between checkpoints of a family is read from the config here
(windows, rotary tables, q/k norms, soft caps); what a family always does is its own code.

Imports torch and the block modules of `batchgen.models`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .attention import Attention
from .config import ModelConfig
from .layers import DecoderLayer, PreNormLayer
from .mlp import DenseMLP, MoEMLP
from .rope import RotaryTable, partial_rotary_order, rotary_table

__all__ = [
    "BuildOptions",
    "Family",
    "ModelParts",
    "Shapes",
    "WeightReader",
    "attention_shapes",
    "build_attention",
    "build_dense_mlp",
    "build_parts",
    "build_prenorm_layers",
    "dense_mlp_shapes",
    "layer_rotary_tables",
    "model_shapes",
    "norm_shapes",
]

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """Where the model lives and the longest sequence it holds (the rotary tables' length)."""

    device: torch.device
    dtype: torch.dtype
    max_model_len: int


@dataclass(frozen=True, slots=True)
class ModelParts:
    """A built model: embedding (scaled by `embed_scale` on lookup when set), layers, final norm,
    output projection (None: tied to the embedding) and final logit soft cap."""

    embed: torch.Tensor
    embed_scale: float | None
    layers: list[DecoderLayer]
    final_norm: torch.Tensor
    lm_head: torch.Tensor | None
    final_logit_softcap: float | None


class WeightReader:
    """Hugging Face-named weights moved to the model's device and dtype as they are taken."""

    def __init__(self, weights: Mapping[str, torch.Tensor], options: BuildOptions) -> None:
        self._weights = weights
        self._device = options.device
        self._dtype = options.dtype

    def take(self, name: str) -> torch.Tensor:
        """Raises KeyError naming a missing tensor."""
        if name not in self._weights:
            raise KeyError(f"checkpoint is missing tensor {name!r}")
        return self._weights[name].to(device=self._device, dtype=self._dtype).contiguous()

    def cat(self, names: list[str]) -> torch.Tensor:
        """The named tensors stacked along dim 0 (fused projections)."""
        return torch.cat([self.take(n) for n in names], dim=0)

    def take_norm(self, name: str, offset: float) -> torch.Tensor:
        """An RMSNorm weight as the kernels apply it (`w * x_normed`): Gemma stores `w - 1`
        (offset 1), computed in float32 as transformers does."""
        weight = self.take(name)
        return weight if offset == 0.0 else (offset + weight.float()).to(self._dtype)


@dataclass(frozen=True, slots=True)
class Family:
    architectures: tuple[str, ...]
    weight_shapes: Callable[[ModelConfig], Shapes]
    build: Callable[[ModelConfig, WeightReader, BuildOptions], ModelParts]


def model_shapes(config: ModelConfig, per_layer: Callable[[int, str], Shapes]) -> Shapes:
    """Embedding, final norm, untied lm_head, plus `per_layer(idx, "model.layers.{idx}.")`."""
    hidden = config.hidden_size
    shapes: Shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    for idx in range(config.num_layers):
        shapes.update(per_layer(idx, f"model.layers.{idx}."))
    return shapes


def attention_shapes(config: ModelConfig, prefix: str, *, fused_qkv: bool = False) -> Shapes:
    """self_attn.* of one layer: q/k/v (or a fused qkv_proj), o_proj, biases, q/k norms."""
    hidden, head_dim = config.hidden_size, config.head_dim
    q_dim, kv_dim = config.num_heads * head_dim, config.num_kv_heads * head_dim
    p = prefix + "self_attn."
    shapes: Shapes = {p + "o_proj.weight": (hidden, q_dim)}
    if fused_qkv:
        shapes[p + "qkv_proj.weight"] = (q_dim + 2 * kv_dim, hidden)
    else:
        shapes.update({p + "q_proj.weight": (q_dim, hidden), p + "k_proj.weight": (kv_dim, hidden), p + "v_proj.weight": (kv_dim, hidden)})
    if config.qkv_bias:
        shapes.update({p + "q_proj.bias": (q_dim,), p + "k_proj.bias": (kv_dim,), p + "v_proj.bias": (kv_dim,)})
    if config.attention_out_bias:
        shapes[p + "o_proj.bias"] = (hidden,)
    if config.qk_norm:
        shapes.update({p + "q_norm.weight": (head_dim,), p + "k_norm.weight": (head_dim,)})
    return shapes


def dense_mlp_shapes(config: ModelConfig, prefix: str, *, fused: bool = False) -> Shapes:
    hidden, inter = config.hidden_size, config.intermediate_size
    p = prefix + "mlp."
    if fused:
        return {p + "gate_up_proj.weight": (2 * inter, hidden), p + "down_proj.weight": (hidden, inter)}
    return {p + "gate_proj.weight": (inter, hidden), p + "up_proj.weight": (inter, hidden), p + "down_proj.weight": (hidden, inter)}


def layer_rotary_tables(config: ModelConfig, options: BuildOptions) -> list[RotaryTable | None]:
    """Each layer's rotary table: None on `nope_layers`; the local (unscaled) base on sliding
    layers when the config has one (Gemma 3); the global base and scaling elsewhere. Layers of one
    kind share one table."""

    def table(theta: float, scaling: bool) -> RotaryTable:
        return rotary_table(
            config.head_dim, config.rotary_dim, theta, config.rope_scaling if scaling else None,
            max_model_len=options.max_model_len, device=options.device,
        )  # fmt: skip

    global_table = table(config.rope_theta, scaling=True)
    local_table = None if config.rope_local_theta is None else table(config.rope_local_theta, scaling=False)
    tables: list[RotaryTable | None] = []
    for idx in range(config.num_layers):
        if idx in config.nope_layers:
            tables.append(None)
        elif local_table is not None and config.layer_sliding_window(idx) is not None:
            tables.append(local_table)
        else:
            tables.append(global_table)
    return tables


def _reorder_heads(x: torch.Tensor, num_heads: int, order: list[int]) -> torch.Tensor:
    """Reorder the head dimensions of q or k rows (weight [heads * D, in] or bias [heads * D])."""
    head_dim = len(order)
    index = torch.tensor(order, device=x.device)
    rows = x.reshape(num_heads, head_dim, *x.shape[1:]).index_select(1, index)
    return rows.reshape(x.shape).contiguous()


def build_attention(
    config: ModelConfig,
    reader: WeightReader,
    layer_idx: int,
    rope: RotaryTable | None,
    *,
    fused_qkv: bool = False,
    norm_offset: float = 0.0,
) -> Attention:
    """Layer `layer_idx`'s attention from `model.layers.N.self_attn.*` (module docstring). With
    partial rotary, q/k rows (and their biases and norms) are reordered as `rope.py` explains."""
    p = f"model.layers.{layer_idx}.self_attn."
    c = config
    q_dim, kv_dim = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    qkv = reader.take(p + "qkv_proj.weight") if fused_qkv else reader.cat([p + f"{n}_proj.weight" for n in "qkv"])
    bias = reader.cat([p + f"{n}_proj.bias" for n in "qkv"]) if c.qkv_bias else None
    q_norm = reader.take_norm(p + "q_norm.weight", norm_offset) if c.qk_norm else None
    k_norm = reader.take_norm(p + "k_norm.weight", norm_offset) if c.qk_norm else None
    if c.rotary_dim < c.head_dim:
        order = partial_rotary_order(c.head_dim, c.rotary_dim)

        def reorder(x: torch.Tensor) -> torch.Tensor:
            q, k, v = torch.split(x, [q_dim, kv_dim, kv_dim])
            return torch.cat([_reorder_heads(q, c.num_heads, order), _reorder_heads(k, c.num_kv_heads, order), v])

        qkv = reorder(qkv)
        bias = None if bias is None else reorder(bias)
        q_norm = None if q_norm is None else _reorder_heads(q_norm, 1, order)
        k_norm = None if k_norm is None else _reorder_heads(k_norm, 1, order)
    scale = (c.query_pre_attn_scalar if c.query_pre_attn_scalar is not None else c.head_dim) ** -0.5
    return Attention(
        qkv=qkv,
        qkv_bias=bias,
        o_proj=reader.take(p + "o_proj.weight"),
        o_bias=reader.take(p + "o_proj.bias") if c.attention_out_bias else None,
        num_heads=c.num_heads,
        num_kv_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        scale=scale,
        rope=rope,
        q_norm=q_norm,
        k_norm=k_norm,
        norm_eps=c.rms_norm_eps,
        sliding_window=c.layer_sliding_window(layer_idx),
        soft_cap=c.attn_logit_softcap,
    )


def build_dense_mlp(
    config: ModelConfig, reader: WeightReader, prefix: str, *, fused: bool = False
) -> DenseMLP:
    """`prefix` + gate_proj / up_proj / down_proj (or a fused gate_up_proj)."""
    gate_up = reader.take(prefix + "gate_up_proj.weight") if fused else reader.cat([prefix + "gate_proj.weight", prefix + "up_proj.weight"])
    return DenseMLP(gate_up, reader.take(prefix + "down_proj.weight"), config.hidden_act)


def norm_shapes(config: ModelConfig, prefix: str, names: tuple[str, ...]) -> Shapes:
    return {f"{prefix}{name}.weight": (config.hidden_size,) for name in names}


def build_prenorm_layers(
    config: ModelConfig,
    reader: WeightReader,
    options: BuildOptions,
    mlp_for: Callable[[int, str], DenseMLP | MoEMLP],
    *,
    fused_qkv: bool = False,
) -> list[DecoderLayer]:
    """Every layer as a `PreNormLayer` (input_layernorm, post_attention_layernorm); the MLP of
    layer N is `mlp_for(N, "model.layers.N.")`."""
    tables = layer_rotary_tables(config, options)
    layers: list[DecoderLayer] = []
    for idx in range(config.num_layers):
        prefix = f"model.layers.{idx}."
        layers.append(
            PreNormLayer(
                build_attention(config, reader, idx, tables[idx], fused_qkv=fused_qkv),
                mlp_for(idx, prefix),
                input_norm=reader.take(prefix + "input_layernorm.weight"),
                post_attention_norm=reader.take(prefix + "post_attention_layernorm.weight"),
                eps=config.rms_norm_eps,
            )
        )
    return layers


def build_parts(
    config: ModelConfig,
    reader: WeightReader,
    layers: list[DecoderLayer],
    *,
    embed_scale: float | None = None,
    norm_offset: float = 0.0,
) -> ModelParts:
    """The parts around the layers: embedding, final norm, lm_head unless tied, final soft cap."""
    return ModelParts(
        embed=reader.take("model.embed_tokens.weight"),
        embed_scale=embed_scale,
        layers=layers,
        final_norm=reader.take_norm("model.norm.weight", norm_offset),
        lm_head=None if config.tie_word_embeddings else reader.take("lm_head.weight"),
        final_logit_softcap=config.final_logit_softcap,
    )
