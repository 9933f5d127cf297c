"""The Gemma family: Gemma 2 and Gemma 3 (text).

What every Gemma does, here rather than in the config: embeddings scaled by sqrt(hidden_size) on
lookup (rounded to the model's dtype, as transformers does; the tied output projection uses the
unscaled matrix); RMSNorms that multiply by `1 + w` (checkpoints store `w`; the weight is
offset once at load, in float32); sandwich layers (`layers.SandwichLayer`: post-attention and
pre/post-feedforward norms); a GeGLU MLP (tanh GELU). From the config: sliding-window attention
on the layers `layer_types` marks, the score scale `query_pre_attn_scalar ** -0.5`, attention
and final logit soft caps (Gemma 2), q/k norms and the local rotary base of sliding layers
(Gemma 3).

Imports torch and `batchgen.models`' block modules.
"""

from __future__ import annotations

import torch

from .config import ModelConfig
from .family import (
    BuildOptions,
    Family,
    ModelParts,
    Shapes,
    WeightReader,
    attention_shapes,
    build_attention,
    build_dense_mlp,
    build_parts,
    dense_mlp_shapes,
    layer_rotary_tables,
    model_shapes,
    norm_shapes,
)
from .layers import DecoderLayer, SandwichLayer

__all__ = ["FAMILY"]

_NORM_OFFSET = 1.0
_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def weight_shapes(config: ModelConfig) -> Shapes:
    def layer(idx: int, prefix: str) -> Shapes:
        return {**attention_shapes(config, prefix), **dense_mlp_shapes(config, prefix), **norm_shapes(config, prefix, _NORMS)}

    return model_shapes(config, layer)


def build(config: ModelConfig, reader: WeightReader, options: BuildOptions) -> ModelParts:
    tables = layer_rotary_tables(config, options)
    layers: list[DecoderLayer] = []
    for idx in range(config.num_layers):
        prefix = f"model.layers.{idx}."
        norm = {name: reader.take_norm(f"{prefix}{name}.weight", _NORM_OFFSET) for name in _NORMS}
        layers.append(
            SandwichLayer(
                build_attention(config, reader, idx, tables[idx], norm_offset=_NORM_OFFSET),
                build_dense_mlp(config, reader, prefix + "mlp."),
                input_norm=norm["input_layernorm"],
                post_attention_norm=norm["post_attention_layernorm"],
                pre_feedforward_norm=norm["pre_feedforward_layernorm"],
                post_feedforward_norm=norm["post_feedforward_layernorm"],
                eps=config.rms_norm_eps,
            )
        )
    # transformers: embeddings * torch.tensor(hidden_size ** 0.5) cast to the weights' dtype.
    scale = float(torch.tensor(config.hidden_size**0.5, dtype=torch.float32).to(options.dtype))
    return build_parts(config, reader, layers, embed_scale=scale, norm_offset=_NORM_OFFSET)


FAMILY = Family(("gemma2", "gemma3_text"), weight_shapes, build)
