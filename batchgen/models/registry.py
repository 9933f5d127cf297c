"""Architecture name (`ModelConfig.architecture`) -> the family module that builds it.

Every name of `config.SUPPORTED_ARCHITECTURES` has exactly one family (checked at import, so a
name added to one list and not the other fails at once).

Imports the family modules of `batchgen.models`.
"""

from __future__ import annotations

from . import gemma, llama, mixtral, phi3, qwen3
from .config import SUPPORTED_ARCHITECTURES, ModelConfig
from .family import Family, Shapes

__all__ = ["FAMILIES", "expected_weight_shapes", "family_for"]

FAMILIES: dict[str, Family] = {
    name: module.FAMILY
    for module in (llama, qwen3, mixtral, gemma, phi3)
    for name in module.FAMILY.architectures
}

if sorted(FAMILIES) != sorted(SUPPORTED_ARCHITECTURES):
    raise RuntimeError(f"model families {sorted(FAMILIES)} != supported architectures {sorted(SUPPORTED_ARCHITECTURES)}")


def family_for(architecture: str) -> Family:
    """The family of `architecture`; ValueError naming it and the supported ones."""
    if architecture not in FAMILIES:
        raise ValueError(f"no model family for architecture {architecture!r}; supported: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[architecture]


def expected_weight_shapes(config: ModelConfig) -> Shapes:
    """Every weight name (Hugging Face) a checkpoint of `config` holds, with its shape."""
    return family_for(config.architecture).weight_shapes(config)
