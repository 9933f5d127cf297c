"""Model hyper-parameters of the supported Llama-family decoders, as frozen dataclasses.

`ModelConfig` is what the model and the runner are built from; it is filled either from a Hugging
Face `config.json` (`ModelConfig.from_hf_dict`) or from GGUF metadata (`gguf_loader`). Invariants
checked in `__post_init__` (no I/O there): sizes positive, `num_heads % num_kv_heads == 0`,
`head_dim` even (rotary embeddings rotate pairs), token ids non-negative.

Imports nothing of ours and no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchgen._checks import check_int

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelConfig", "RopeScaling"]

SUPPORTED_ARCHITECTURES: tuple[str, ...] = ("llama", "mistral", "qwen2")

# Hugging Face class name -> our architecture name.
_HF_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}

# transformers' defaults for keys a config.json may leave out, per architecture.
_DEFAULT_MAX_POSITIONS: dict[str, int] = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768}
_DEFAULT_RMS_NORM_EPS: dict[str, float] = {"llama": 1e-6, "mistral": 1e-6, "qwen2": 1e-6}
_DEFAULT_ROPE_THETA: dict[str, float] = {"llama": 10000.0, "mistral": 10000.0, "qwen2": 10000.0}

_ROPE_TYPES = ("default", "linear", "llama3")


def _check_positive_float(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{owner}.{name} must be a number > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Rotary frequency scaling.

    `rope_type` "llama3" uses all fields (Llama 3.1 wavelength-dependent scaling); "linear" divides
    positions by `factor`; "default" means no scaling (loaders map it to `rope_scaling=None`).
    """

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in _ROPE_TYPES:
            raise ValueError(
                f"RopeScaling.rope_type must be one of {', '.join(_ROPE_TYPES)}, got {self.rope_type!r}"
            )
        _check_positive_float("RopeScaling", "factor", self.factor)
        _check_positive_float("RopeScaling", "low_freq_factor", self.low_freq_factor)
        _check_positive_float("RopeScaling", "high_freq_factor", self.high_freq_factor)
        check_int("RopeScaling.original_max_position_embeddings",
            self.original_max_position_embeddings,
            minimum=1,
        )
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                "RopeScaling.high_freq_factor must be greater than low_freq_factor for llama3 "
                f"scaling, got {self.high_freq_factor!r} <= {self.low_freq_factor!r}"
            )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and constants of one decoder-only model.

    `head_dim` is per attention head; `eos_token_ids` lists every id that ends generation;
    `qkv_bias` says whether q/k/v projections carry a bias (Qwen2); `sliding_window` (tokens) is
    set only when every layer uses sliding-window attention.
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
        for name in ("tie_word_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}.{name} must be a boolean, got {getattr(self, name)!r}")
        if self.bos_token_id is not None:
            check_int(f"{owner}.bos_token_id", self.bos_token_id, minimum=0)
        if not isinstance(self.eos_token_ids, tuple):
            raise ValueError(f"{owner}.eos_token_ids must be a tuple, got {self.eos_token_ids!r}")
        for token_id in self.eos_token_ids:
            check_int(f"{owner}.eos_token_ids", token_id, minimum=0)
        if self.sliding_window is not None:
            check_int(f"{owner}.sliding_window", self.sliding_window, minimum=1)

    @property
    def num_queries_per_kv(self) -> int:
        """Query heads sharing one KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], *, source: str = "config.json") -> ModelConfig:
        """Build from a Hugging Face `config.json` mapping; `source` names the file in errors.

        Raises ValueError for an unsupported architecture (listing the supported ones), a missing
        required key, or a feature the model code does not implement (MLP bias, non-SiLU
        activation, unsupported rope scaling, sliding window on only some layers).
        """
        architecture = _architecture(d, source)

        def required(key: str) -> Any:
            if key not in d or d[key] is None:
                raise ValueError(
                    f"{source}: missing required key {key!r} for a {architecture} model"
                )
            return d[key]

        hidden_act = d.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise ValueError(f"{source}: hidden_act must be 'silu', got {hidden_act!r}")
        if d.get("mlp_bias", False):
            raise ValueError(f"{source}: mlp_bias=true is not supported")

        hidden_size = required("hidden_size")
        num_heads = required("num_attention_heads")
        num_kv_heads = d.get("num_key_value_heads") or num_heads
        head_dim = d.get("head_dim")
        if head_dim is None:
            if not isinstance(hidden_size, int) or not isinstance(num_heads, int) or num_heads < 1:
                raise ValueError(
                    f"{source}: hidden_size and num_attention_heads must be integers, got "
                    f"{hidden_size!r} and {num_heads!r}"
                )
            head_dim = hidden_size // num_heads

        rope_parameters = d.get("rope_parameters")
        if rope_parameters is not None and not isinstance(rope_parameters, Mapping):
            raise ValueError(
                f"{source}: rope_parameters must be a mapping, got {rope_parameters!r}"
            )
        rope_theta = d.get("rope_theta")
        if rope_theta is None and rope_parameters is not None:
            rope_theta = rope_parameters.get("rope_theta")
        if rope_theta is None:
            rope_theta = _DEFAULT_ROPE_THETA[architecture]
        scaling_dict = d.get("rope_scaling")
        if scaling_dict is None:
            scaling_dict = rope_parameters

        eos = d.get("eos_token_id")
        if eos is None:
            eos_token_ids: tuple[int, ...] = ()
        elif isinstance(eos, list | tuple):
            eos_token_ids = tuple(eos)
        else:
            eos_token_ids = (eos,)

        if architecture == "qwen2":
            qkv_bias = True
        elif architecture == "llama":
            qkv_bias = bool(d.get("attention_bias", False))
        else:
            qkv_bias = False

        return cls(
            architecture=architecture,
            vocab_size=required("vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=required("intermediate_size"),
            num_layers=required("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps") or _DEFAULT_RMS_NORM_EPS[architecture]),
            rope_theta=float(rope_theta),
            rope_scaling=_rope_scaling(scaling_dict, source),
            max_position_embeddings=d.get("max_position_embeddings")
            or _DEFAULT_MAX_POSITIONS[architecture],
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_token_ids,
            sliding_window=_sliding_window(d, architecture, source),
        )


def _architecture(d: Mapping[str, Any], source: str) -> str:
    model_type = d.get("model_type")
    if model_type in SUPPORTED_ARCHITECTURES:
        return str(model_type)
    architectures = d.get("architectures") or []
    for name in architectures:
        if name in _HF_ARCHITECTURES:
            return _HF_ARCHITECTURES[name]
    raise ValueError(
        f"{source}: unsupported architecture (model_type={model_type!r}, "
        f"architectures={list(architectures)!r}); supported: {', '.join(_HF_ARCHITECTURES)} "
        f"(model_type {', '.join(SUPPORTED_ARCHITECTURES)})"
    )


def _rope_scaling(scaling: Mapping[str, Any] | None, source: str) -> RopeScaling | None:
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise ValueError(f"{source}: rope_scaling must be a mapping, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type in (None, "default"):
        return None
    if rope_type == "linear":
        return RopeScaling(rope_type="linear", factor=float(scaling["factor"]))
    if rope_type == "llama3":
        try:
            return RopeScaling(
                rope_type="llama3",
                factor=float(scaling["factor"]),
                low_freq_factor=float(scaling["low_freq_factor"]),
                high_freq_factor=float(scaling["high_freq_factor"]),
                original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
            )
        except KeyError as exc:
            raise ValueError(
                f"{source}: rope_scaling of type llama3 lacks {exc.args[0]!r}"
            ) from exc
    raise ValueError(
        f"{source}: rope_scaling type {rope_type!r} is not supported; supported: "
        f"{', '.join(_ROPE_TYPES)}"
    )


def _sliding_window(d: Mapping[str, Any], architecture: str, source: str) -> int | None:
    """The window (tokens) when every layer slides; None when none does; mixed is an error."""
    window = d.get("sliding_window")
    if architecture == "llama" or window is None:
        return None
    layer_types = d.get("layer_types")
    if architecture == "qwen2":
        if not d.get("use_sliding_window", False):
            return None
        if layer_types is None:
            num_layers = d.get("num_hidden_layers", 0)
            first_sliding = d.get("max_window_layers", 28)
            layer_types = [
                "sliding_attention" if i >= first_sliding else "full_attention"
                for i in range(num_layers)
            ]
    if layer_types is not None:
        kinds = set(layer_types)
        if kinds <= {"full_attention"}:
            return None
        if kinds != {"sliding_attention"}:
            raise ValueError(
                f"{source}: sliding-window attention on only some layers is not supported "
                f"(layer_types={sorted(kinds)})"
            )
    return int(window)
