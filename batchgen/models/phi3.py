"""Phi-3 and Phi-4-mini (`Phi3ForCausalLM`).

Llama-style pre-norm layers whose checkpoints store q/k/v fused (`self_attn.qkv_proj`, rows
`| q | k | v |`) and gate/up fused (`mlp.gate_up_proj`, rows `| gate | up |`) -- the layouts the
blocks use, so they load as they are. Phi-4-mini rotates only part of each head
(`partial_rotary_factor` 0.75: see `rope.py` for how the kernels' whole-head rotation serves it);
long-context variants carry LongRoPE scaling, Phi-3-mini-4k a sliding window on every layer.

Imports torch and `batchgen.models`' block modules.
"""

from __future__ import annotations

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

__all__ = ["FAMILY"]

_NORMS = ("input_layernorm", "post_attention_layernorm")


def weight_shapes(config: ModelConfig) -> Shapes:
    def layer(idx: int, prefix: str) -> Shapes:
        return {
            **attention_shapes(config, prefix, fused_qkv=True),
            **dense_mlp_shapes(config, prefix, fused=True),
            **norm_shapes(config, prefix, _NORMS),
        }

    return model_shapes(config, layer)


def build(config: ModelConfig, reader: WeightReader, options: BuildOptions) -> ModelParts:
    layers = build_prenorm_layers(
        config, reader, options,
        lambda idx, prefix: build_dense_mlp(config, reader, prefix + "mlp.", fused=True), fused_qkv=True,
    )  # fmt: skip
    return build_parts(config, reader, layers)


FAMILY = Family(("phi3",), weight_shapes, build)
