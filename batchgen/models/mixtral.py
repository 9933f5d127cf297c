"""Mixtral: Mistral layers whose MLP is a mixture of experts.

Router `block_sparse_moe.gate`, experts `block_sparse_moe.experts.E.w1` (gate), `w3` (up) and
`w2` (down) -- the names of Mistral's checkpoints, which transformers reads and writes; softmax
over the router's logits, top-k (2 of 8 for Mixtral 8x7B), the k weights always renormalised to
sum 1 (`ModelConfig.norm_topk_prob` is True for every Mixtral config).

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
    build_parts,
    build_prenorm_layers,
    model_shapes,
    norm_shapes,
)
from .mlp import DenseMLP, MoEMLP

__all__ = ["FAMILY"]

_NORMS = ("input_layernorm", "post_attention_layernorm")


def weight_shapes(config: ModelConfig) -> Shapes:
    hidden, inter = config.hidden_size, config.moe_intermediate_size

    def layer(idx: int, prefix: str) -> Shapes:
        p = prefix + "block_sparse_moe."
        shapes: Shapes = {p + "gate.weight": (config.num_experts, hidden)}
        for e in range(config.num_experts):
            q = f"{p}experts.{e}."
            shapes.update({q + "w1.weight": (inter, hidden), q + "w3.weight": (inter, hidden), q + "w2.weight": (hidden, inter)})
        return {**attention_shapes(config, prefix), **shapes, **norm_shapes(config, prefix, _NORMS)}

    return model_shapes(config, layer)


def build(config: ModelConfig, reader: WeightReader, options: BuildOptions) -> ModelParts:
    def mlp_for(idx: int, prefix: str) -> DenseMLP | MoEMLP:
        p = prefix + "block_sparse_moe."
        gate_ups: list[Weight] = []
        downs: list[Weight] = []
        for e in range(config.num_experts):
            q = f"{p}experts.{e}."
            gate_ups.append(reader.cat([q + "w1.weight", q + "w3.weight"]))
            downs.append(reader.take(q + "w2.weight"))
        return MoEMLP(
            reader.take(p + "gate.weight"), gate_ups, downs,
            top_k=config.num_experts_per_tok, renormalize=config.norm_topk_prob, act=config.hidden_act,
        )  # fmt: skip

    return build_parts(config, reader, build_prenorm_layers(config, reader, options, mlp_for))


FAMILY = Family(("mixtral",), weight_shapes, build)
