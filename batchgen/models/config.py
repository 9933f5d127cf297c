"""Model hyper-parameters of the supported decoders, as frozen dataclasses.

`ModelConfig` is what the model and the runner are built from; it is filled either from a Hugging
Face `config.json` (`ModelConfig.from_hf_dict`, implemented in `hf_config`) or from GGUF metadata
(`gguf_loader`). It holds what varies between checkpoints of one family (sizes, which layers
slide, soft caps, experts); what a family always does (Gemma's `1 + w` norms, its post-norms) is
the family module's. Invariants checked in `__post_init__` (no I/O there): sizes positive,
`num_heads % num_kv_heads == 0`, `head_dim` and the rotary width even (rotary embeddings rotate
pairs), token ids non-negative, per-layer lists as long as the model and in range, experts
consistent (`num_experts_per_tok <= num_experts`).

Imports nothing of ours but `batchgen._checks`, and no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchgen._checks import check_int

__all__ = [
    "ACTIVATIONS",
    "LAYER_TYPES",
    "ROPE_TYPES",
    "SUPPORTED_ARCHITECTURES",
    "ModelConfig",
    "RopeScaling",
]

# Our architecture names (Hugging Face `model_type`s), one per model family module entry in
# `registry`; `hf_config` maps the `architectures` class names onto them.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "gemma2",
    "gemma3_text",
    "phi3",
    "smollm3",
)

ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")
LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


def _check_positive_float(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{owner}.{name} must be a finite number > 0, got {value!r}")


def _check_optional_positive(owner: str, name: str, value: object) -> None:
    if value is not None:
        _check_positive_float(owner, name, value)


def _check_layer_ids(owner: str, name: str, value: object, num_layers: int) -> None:
    if not isinstance(value, tuple):
        raise ValueError(f"{owner}.{name} must be a tuple of layer indices, got {value!r}")
    for idx in value:
        check_int(f"{owner}.{name}", idx, minimum=0)
        if idx >= num_layers:
            raise ValueError(f"{owner}.{name} names layer {idx}, but the model has {num_layers} layers")
    if len(set(value)) != len(value) or list(value) != sorted(value):
        raise ValueError(f"{owner}.{name} must list distinct layers in ascending order, got {value!r}")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Rotary frequency scaling, as transformers' `rope_parameters` describe it (`rope.py`).

    - "linear": positions divided by `factor`.
    - "llama3": Llama 3.1 wavelength-dependent scaling (`factor`, `low_freq_factor`,
      `high_freq_factor`, `original_max_position_embeddings`).
    - "dynamic": NTK-aware base growth for contexts past `original_max_position_embeddings`
      (transformers takes the config's `max_position_embeddings` as that length).
    - "yarn": `factor`, `original_max_position_embeddings`, `beta_fast`, `beta_slow`, `mscale`,
      `mscale_all_dim`, `attention_factor` (None: derived from the mscales), `truncate`.
    - "longrope": per-frequency `short_factor` / `long_factor` (one per rotary pair),
      `original_max_position_embeddings`, `factor` and `attention_factor` (None: derived).
    "default" means no scaling (loaders map it to `rope_scaling=None`).
    """

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        owner = "RopeScaling"
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"{owner}.rope_type must be one of {', '.join(ROPE_TYPES)}, got {self.rope_type!r}"
            )
        for name in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow"):
            _check_positive_float(owner, name, getattr(self, name))
        for name in ("mscale", "mscale_all_dim", "attention_factor"):
            _check_optional_positive(owner, name, getattr(self, name))
        check_int(f"{owner}.original_max_position_embeddings", self.original_max_position_embeddings, minimum=1)
        if not isinstance(self.truncate, bool):
            raise ValueError(f"{owner}.truncate must be a boolean, got {self.truncate!r}")
        for name in ("short_factor", "long_factor"):
            values = getattr(self, name)
            if not isinstance(values, tuple):
                raise ValueError(f"{owner}.{name} must be a tuple of numbers, got {values!r}")
            for value in values:
                _check_positive_float(owner, name, value)
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                f"{owner}.high_freq_factor must be greater than low_freq_factor for llama3 "
                f"scaling, got {self.high_freq_factor!r} <= {self.low_freq_factor!r}"
            )
        if self.rope_type == "longrope" and (
            not self.short_factor or len(self.short_factor) != len(self.long_factor)
        ):
            raise ValueError(
                f"{owner}.short_factor and long_factor must be non-empty and of one length for "
                f"longrope, got {len(self.short_factor)} and {len(self.long_factor)}"
            )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and constants of one decoder-only model.

    `head_dim` is per attention head; `eos_token_ids` lists every id that ends generation;
    `qkv_bias` says whether q/k/v projections carry a bias (Qwen2), `attention_out_bias` whether
    the output projection does (`attention_bias` of Llama-style configs sets both).
    Attention: `sliding_window` (tokens, the query's own included) applies to the layers
    `layer_types` marks "sliding_attention", or to every layer when `layer_types` is empty;
    `attn_logit_softcap` caps scores (Gemma 2); `query_pre_attn_scalar` replaces `head_dim` in
    the score scale `1 / sqrt(.)`; `qk_norm` adds an RMSNorm over each q and k head (Qwen 3,
    Gemma 3). Rotary embeddings: `rope_theta` / `rope_scaling` (on "full_attention" layers when
    `rope_local_theta` is set: Gemma 3 gives its sliding layers that base, unscaled), over the
    first `partial_rotary_factor` of each head (Phi-4-mini), none on the layers `nope_layers` lists
    (SmolLM 3). Output: `final_logit_softcap` caps the logits (Gemma 2). `hidden_act` is the gated
    MLP's activation. Mixture of experts (`num_experts` > 0): `num_experts_per_tok` experts of
    `moe_intermediate_size` per token, their weights renormalized to sum 1 when
    `norm_topk_prob`; the layers `dense_layers` lists keep a dense MLP of `intermediate_size`.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None = None
    attention_out_bias: bool = False
    layer_types: tuple[str, ...] = ()
    hidden_act: str = "silu"
    qk_norm: bool = False
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    rope_local_theta: float | None = None
    partial_rotary_factor: float = 1.0
    nope_layers: tuple[int, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        owner = "ModelConfig"
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{owner}.architecture must be one of {', '.join(SUPPORTED_ARCHITECTURES)}, "
                f"got {self.architecture!r}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            check_int(f"{owner}.{name}", getattr(self, name), minimum=1)
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"{owner}.num_heads ({self.num_heads}) must be a multiple of "
                f"{owner}.num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"{owner}.head_dim must be even for rotary embeddings, got {self.head_dim}"
            )
        _check_positive_float(owner, "rms_norm_eps", self.rms_norm_eps)
        _check_positive_float(owner, "rope_theta", self.rope_theta)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(
                f"{owner}.rope_scaling must be a RopeScaling or None, got {self.rope_scaling!r}"
            )
        for name in ("tie_word_embeddings", "qkv_bias", "attention_out_bias", "qk_norm", "norm_topk_prob"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}.{name} must be a boolean, got {getattr(self, name)!r}")
        if self.bos_token_id is not None:
            check_int(f"{owner}.bos_token_id", self.bos_token_id, minimum=0)
        if not isinstance(self.eos_token_ids, tuple):
            raise ValueError(f"{owner}.eos_token_ids must be a tuple, got {self.eos_token_ids!r}")
        for token_id in self.eos_token_ids:
            check_int(f"{owner}.eos_token_ids", token_id, minimum=0)
        self._check_attention(owner)
        self._check_rotary(owner)
        self._check_experts(owner)

    def _check_attention(self, owner: str) -> None:
        if self.sliding_window is not None:
            check_int(f"{owner}.sliding_window", self.sliding_window, minimum=1)
        if not isinstance(self.layer_types, tuple) or any(t not in LAYER_TYPES for t in self.layer_types):
            raise ValueError(
                f"{owner}.layer_types must be a tuple of {' / '.join(LAYER_TYPES)}, got {self.layer_types!r}"
            )
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"{owner}.layer_types lists {len(self.layer_types)} layers, the model has {self.num_layers}"
            )
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError(f"{owner}.layer_types has sliding layers but sliding_window is None")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"{owner}.hidden_act must be one of {', '.join(ACTIVATIONS)}, got {self.hidden_act!r}")
        for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
            _check_optional_positive(owner, name, getattr(self, name))

    def _check_rotary(self, owner: str) -> None:
        _check_optional_positive(owner, "rope_local_theta", self.rope_local_theta)
        factor = self.partial_rotary_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
            raise ValueError(f"{owner}.partial_rotary_factor must be in (0, 1], got {factor!r}")
        rotary = self.rotary_dim
        if rotary < 2 or rotary % 2 or (self.head_dim - rotary) % 2:
            raise ValueError(
                f"{owner}.partial_rotary_factor {factor} gives {rotary} rotary dimensions of "
                f"head_dim {self.head_dim}; both parts must be even and the rotary one >= 2"
            )
        scaling = self.rope_scaling
        if scaling is not None and scaling.rope_type == "longrope" and len(scaling.short_factor) != rotary // 2:
            raise ValueError(
                f"{owner}.rope_scaling has {len(scaling.short_factor)} longrope factors, the model "
                f"rotates {rotary // 2} pairs per head"
            )
        _check_layer_ids(owner, "nope_layers", self.nope_layers, self.num_layers)

    def _check_experts(self, owner: str) -> None:
        check_int(f"{owner}.num_experts", self.num_experts, minimum=0)
        check_int(f"{owner}.num_experts_per_tok", self.num_experts_per_tok, minimum=0)
        check_int(f"{owner}.moe_intermediate_size", self.moe_intermediate_size, minimum=0)
        _check_layer_ids(owner, "dense_layers", self.dense_layers, self.num_layers)
        if self.num_experts == 0:
            if self.num_experts_per_tok or self.moe_intermediate_size or self.dense_layers:
                raise ValueError(f"{owner}.num_experts is 0 but expert fields are set")
            return
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"{owner}.num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                f"got {self.num_experts_per_tok}"
            )
        check_int(f"{owner}.moe_intermediate_size", self.moe_intermediate_size, minimum=1)

    @property
    def num_queries_per_kv(self) -> int:
        """Query heads sharing one KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head the rotary embedding turns (the first ones, as transformers)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_sliding_window(self, layer_idx: int) -> int | None:
        """The window of layer `layer_idx` (tokens), or None when it attends to all earlier ones."""
        if not self.layer_types or self.layer_types[layer_idx] == "sliding_attention":
            return self.sliding_window
        return None

    def is_moe_layer(self, layer_idx: int) -> bool:
        return self.is_moe and layer_idx not in self.dense_layers

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], *, source: str = "config.json") -> ModelConfig:
        """Build from a Hugging Face `config.json` mapping; `source` names the file in errors.

        Raises ValueError for an unsupported architecture (listing the supported ones), a missing
        required key, a key batchgen does not know, or a feature the model code does not
        implement (see `hf_config.read_hf_config`).
        """
        from batchgen.models.hf_config import read_hf_config  # the parser builds this class

        return read_hf_config(d, source=source)
