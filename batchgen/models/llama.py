"""The Llama family: Llama 2/3, SmolLM2, Mistral, Qwen2 and SmolLM3 (Llama layers, some without
rotary embedding: `ModelConfig.nope_layers`).

Pre-norm layers (`layers.PreNormLayer`) of grouped-query attention (q/k/v and gate/up fused into
one matrix each at load) and a gated SiLU MLP, with Hugging Face's weight names
(`model.layers.N.self_attn.q_proj`, `.mlp.gate_proj`, ...). Optional q/k/v (Qwen2) and output
biases, sliding windows and rope scalings come from the config.

Imports torch and `batchgen.models`' block modules.
"""

from __future__ import annotations

from typing import Any

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
        return {**attention_shapes(config, prefix), **dense_mlp_shapes(config, prefix), **norm_shapes(config, prefix, _NORMS)}

    return model_shapes(config, layer)


def build(config: ModelConfig, reader: WeightReader, options: BuildOptions) -> ModelParts:
    layers = build_prenorm_layers(
        config, reader, options, lambda idx, prefix: build_dense_mlp(config, reader, prefix + "mlp.")
    )
    return build_parts(config, reader, layers)


FAMILY = Family(("llama", "mistral", "qwen2", "smollm3"), weight_shapes, build)


def __getattr__(name: str) -> Any:
    # TODO(#23): `LlamaModel` is the model's name from before the families; callers outside
    # batchgen.models move to `decoder.DecoderModel`. Resolved lazily: decoder imports the registry,
    # which imports this module.
    if name == "LlamaModel":
        from .decoder import DecoderModel

        return DecoderModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
