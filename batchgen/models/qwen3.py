"""The Qwen 3 family: Qwen3 (dense) and Qwen3-MoE.

Llama-style pre-norm layers with an RMSNorm over each q and k head before the rotary embedding
(`ModelConfig.qk_norm`, weights `self_attn.q_norm` / `k_norm`). Qwen3-MoE replaces the MLP of
every layer but `ModelConfig.dense_layers` by a mixture of experts: router `mlp.gate`, experts
`mlp.experts.E.{gate,up,down}_proj`, softmax top-k with the weights renormalised only when the
config's `norm_topk_prob` says so.

Imports torch and `batchgen.models`' block modules.
"""

from __future__ import annotations

from .attention import Weight
from .config import ModelConfig
from .family import (
    BuildOptions,
    Family,
    ModelParts,
    Shapes,
    WeightReader,
    attention_shapes,
    build_dense_mlp,
    build_parts,
    build_prenorm_layers,
    dense_mlp_shapes,
    model_shapes,
    norm_shapes,
)
from .mlp import DenseMLP, MoEMLP

__all__ = ["FAMILY"]

_NORMS = ("input_layernorm", "post_attention_layernorm")


def _experts_shapes(config: ModelConfig, prefix: str) -> Shapes:
    hidden, inter = config.hidden_size, config.moe_intermediate_size
    p = prefix + "mlp."
    shapes: Shapes = {p + "gate.weight": (config.num_experts, hidden)}
    for e in range(config.num_experts):
        q = f"{p}experts.{e}."
        shapes.update({q + "gate_proj.weight": (inter, hidden), q + "up_proj.weight": (inter, hidden), q + "down_proj.weight": (hidden, inter)})
    return shapes


def weight_shapes(config: ModelConfig) -> Shapes:
    def layer(idx: int, prefix: str) -> Shapes:
        mlp = _experts_shapes(config, prefix) if config.is_moe_layer(idx) else dense_mlp_shapes(config, prefix)
        return {**attention_shapes(config, prefix), **mlp, **norm_shapes(config, prefix, _NORMS)}

    return model_shapes(config, layer)


def _moe(config: ModelConfig, reader: WeightReader, prefix: str) -> MoEMLP:
    p = prefix + "mlp."
    gate_ups: list[Weight] = []
    downs: list[Weight] = []
    for e in range(config.num_experts):
        q = f"{p}experts.{e}."
        gate_ups.append(reader.cat([q + "gate_proj.weight", q + "up_proj.weight"]))
        downs.append(reader.take(q + "down_proj.weight"))
    return MoEMLP(
        reader.take(p + "gate.weight"), gate_ups, downs,
        top_k=config.num_experts_per_tok, renormalize=config.norm_topk_prob, act=config.hidden_act,
    )  # fmt: skip


def build(config: ModelConfig, reader: WeightReader, options: BuildOptions) -> ModelParts:
    def mlp_for(idx: int, prefix: str) -> DenseMLP | MoEMLP:
        if config.is_moe_layer(idx):
            return _moe(config, reader, prefix)
        return build_dense_mlp(config, reader, prefix + "mlp.")

    return build_parts(config, reader, build_prenorm_layers(config, reader, options, mlp_for))


FAMILY = Family(("qwen3", "qwen3_moe"), weight_shapes, build)
