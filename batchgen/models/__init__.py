"""Model definitions and checkpoint loaders (Llama family).

The public names are imported lazily, so importing `batchgen.models.config` alone does not pull
torch, safetensors or gguf in.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Checkpoint",
    "ModelConfig",
    "RopeScaling",
    "default_model_path",
    "expected_weight_shapes",
    "load_checkpoint",
]

_LAZY = {
    "Checkpoint": "batchgen.models.checkpoint",
    "default_model_path": "batchgen.models.checkpoint",
    "expected_weight_shapes": "batchgen.models.checkpoint",
    "load_checkpoint": "batchgen.models.checkpoint",
    "ModelConfig": "batchgen.models.config",
    "RopeScaling": "batchgen.models.config",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'batchgen.models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
