"""Model definitions and checkpoint loaders (Llama family).

The public names are imported lazily, so importing `batchgen.models.config` alone does not pull
torch, safetensors or gguf in.

May import: batchgen.kernels, batchgen.tokenizer (a checkpoint carries its tokenizer).
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = [
    "Checkpoint",
    "ModelConfig",
    "RopeScaling",
    "default_model_path",
    "expected_weight_shapes",
    "load_checkpoint",
]

__getattr__ = lazy_getattr(
    __name__,
    {
        "Checkpoint": "checkpoint",
        "default_model_path": "checkpoint",
        "expected_weight_shapes": "checkpoint",
        "load_checkpoint": "checkpoint",
        "ModelConfig": "config",
        "RopeScaling": "config",
    },
)
