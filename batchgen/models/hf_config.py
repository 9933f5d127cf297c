"""Reading a Hugging Face `config.json` mapping into a `ModelConfig`, one reader per architecture.

The architecture comes from `architectures` (the class names below) or, without that key, from
`model_type`. Every key of the mapping must be accounted for: read by the common part or by the
architecture's reader, or listed in `_IGNORED` (metadata and training-only settings that cannot
change what inference computes). Anything else is an error naming the file and the keys: a field
batchgen does not know could change the model, so it refuses to guess. Feature flags batchgen
does not implement are accepted only at their neutral value (`_Keys.neutral`), and rope
parameters only with the keys transformers defines for their type.

Defaults for absent keys are transformers' (its `*Config` classes, version 5) per architecture.
Imports nothing of ours but `batchgen.models.config`; no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from batchgen.models.config import SUPPORTED_ARCHITECTURES, ModelConfig, RopeScaling

__all__ = ["HF_ARCHITECTURES", "read_hf_config", "unsupported_architecture_message"]

# Hugging Face class name -> our architecture name (its model_type).
HF_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "SmolLM3ForCausalLM": "smollm3",
}

# Keys that never change what inference computes: file metadata, training-only settings
# (dropout, initialisation, router losses and jitter), cache and output switches.
_IGNORED = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "auto_map", "use_cache", "cache_implementation", "initializer_range", "attention_dropout",
    "embd_pdrop", "resid_pdrop", "output_attentions", "output_hidden_states", "return_dict",
    "id2label", "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder",
    "pad_token_id", "tokenizer_class", "output_router_logits", "router_aux_loss_coef",
    "router_jitter_noise", "pretraining_tp", "unsloth_version", "unsloth_fixed",
    # nanotron's export marker (SmolLM2): transformers keeps it as a plain attribute, unused.
    "is_llama_config",
    # transformers.js's settings for its ONNX runtime (dtype, KV-cache dtype, external data files).
    "transformers.js_config",
})  # fmt: skip

# Keys that name a feature batchgen refuses outright, with the reason.
_REFUSED = {"quantization_config": "quantized checkpoints are not supported; use float weights"}

# transformers' defaults per architecture: (rope_theta, max_position_embeddings, rms_norm_eps,
# tie_word_embeddings).
_DEFAULTS: dict[str, tuple[float, int, float, bool]] = {
    "llama": (10000.0, 2048, 1e-6, False),
    "mistral": (10000.0, 4096 * 32, 1e-6, False),
    "qwen2": (10000.0, 32768, 1e-6, False),
    "qwen3": (10000.0, 32768, 1e-6, False),
    "qwen3_moe": (10000.0, 32768, 1e-6, False),
    "mixtral": (1e6, 4096 * 32, 1e-5, False),
    "gemma2": (10000.0, 8192, 1e-6, True),
    "gemma3_text": (1e6, 131072, 1e-6, True),
    "phi3": (10000.0, 4096, 1e-5, False),
    "smollm3": (2e6, 32768, 1e-6, True),
}
_GEMMA3_LOCAL_THETA = 10000.0
# transformers' default of a top-level original_max_position_embeddings, for the config classes
# that have the attribute (it overrides the rope dict's even when config.json lacks it).
_TOP_LEVEL_ORIGINAL: dict[str, int] = {"phi3": 4096}

# Keys transformers accepts in a rope dict of each type (besides rope_type/type, rope_theta and
# partial_rotary_factor).
_ROPE_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
    "yarn": frozenset({
        "factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
        "mscale", "mscale_all_dim", "truncate",
    }),
    "longrope": frozenset({"short_factor", "long_factor", "original_max_position_embeddings", "factor", "attention_factor"}),
}
_ROPE_COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})


def unsupported_architecture_message(source: str, model_type: object, architectures: object) -> str:
    return (
        f"{source}: unsupported architecture (model_type={model_type!r}, "
        f"architectures={architectures!r}); supported: {', '.join(HF_ARCHITECTURES)} "
        f"(model_type {', '.join(SUPPORTED_ARCHITECTURES)})"
    )


class _Keys:
    """The mapping with a record of the keys read; `check_all_read` refuses the rest."""

    def __init__(self, d: Mapping[str, Any], source: str, architecture: str) -> None:
        self._d = d
        self.source = source
        self.architecture = architecture
        self._read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self._read.add(key)
        value = self._d.get(key)
        return default if value is None else value

    def get_or(self, key: str, default: Any) -> Any:
        """The value, None included when the key is present and null; `default` when absent
        (transformers' Gemma 2 defaults its soft caps, and null turns them off)."""
        self._read.add(key)
        return self._d.get(key, default)

    def required(self, key: str) -> Any:
        self._read.add(key)
        if self._d.get(key) is None:
            raise ValueError(f"{self.source}: missing required key {key!r} for a {self.architecture} model")
        return self._d[key]

    def neutral(self, key: str, *neutral: Any) -> None:
        """A flag batchgen implements only at its neutral value(s) (None, absent, included)."""
        value = self.get(key)
        if value is not None and value not in neutral:
            raise ValueError(
                f"{self.source}: {key}={value!r} is not supported for {self.architecture} "
                f"(supported: {' or '.join(repr(v) for v in neutral)})"
            )

    def ignore(self, *keys: str) -> None:
        """Keys transformers itself ignores for this architecture."""
        self._read.update(keys)

    def check_all_read(self) -> None:
        for key, reason in _REFUSED.items():
            if key in self._d:
                raise ValueError(f"{self.source}: {key}: {reason}")
        unknown = sorted(set(self._d) - self._read - _IGNORED)
        if unknown:
            raise ValueError(
                f"{self.source}: config key(s) {unknown} are not implemented for "
                f"{self.architecture}; batchgen refuses fields it does not know, since they could "
                "change what the model computes"
            )


def read_hf_config(d: Mapping[str, Any], *, source: str = "config.json") -> ModelConfig:
    """`ModelConfig` of a config.json mapping. Raises ValueError naming `source` (see module)."""
    architecture = _architecture(d, source)
    keys = _Keys(d, source, architecture)
    theta_default, max_pos_default, eps_default, tie_default = _DEFAULTS[architecture]
    hidden_size = keys.required("hidden_size")
    num_heads = keys.required("num_attention_heads")
    head_dim = keys.get("head_dim")
    if head_dim is None:
        if not isinstance(hidden_size, int) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(
                f"{source}: hidden_size and num_attention_heads must be integers, got "
                f"{hidden_size!r} and {num_heads!r}"
            )
        head_dim = hidden_size // num_heads
    eos = keys.get("eos_token_id")
    eos_token_ids = () if eos is None else tuple(eos) if isinstance(eos, list | tuple) else (eos,)
    fields: dict[str, Any] = {
        "architecture": architecture,
        "vocab_size": keys.required("vocab_size"),
        "hidden_size": hidden_size,
        "intermediate_size": keys.required("intermediate_size"),
        "num_layers": keys.required("num_hidden_layers"),
        "num_heads": num_heads,
        "num_kv_heads": keys.get("num_key_value_heads", num_heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(keys.get("rms_norm_eps", eps_default)),
        "max_position_embeddings": keys.get("max_position_embeddings", max_pos_default),
        "tie_word_embeddings": bool(keys.get("tie_word_embeddings", tie_default)),
        "bos_token_id": keys.get("bos_token_id"),
        "eos_token_ids": eos_token_ids,
        "qkv_bias": False,
    }
    fields.update(_READERS[architecture](keys, fields))
    if "rope_theta" not in fields:
        fields.update(_rope(keys, fields, theta_default))
    keys.check_all_read()
    return ModelConfig(**fields)


def _architecture(d: Mapping[str, Any], source: str) -> str:
    model_type = d.get("model_type")
    architectures = d.get("architectures")
    if architectures:
        names = list(architectures) if isinstance(architectures, list | tuple) else [architectures]
        for name in names:
            if name in HF_ARCHITECTURES:
                return HF_ARCHITECTURES[name]
        raise ValueError(unsupported_architecture_message(source, model_type, names))
    if model_type in SUPPORTED_ARCHITECTURES:
        return str(model_type)
    raise ValueError(unsupported_architecture_message(source, model_type, architectures))


# ---------------------------------------------------------------- rope


def _rope(keys: _Keys, fields: Mapping[str, Any], theta_default: float) -> dict[str, Any]:
    """rope_theta, rope_scaling and partial_rotary_factor from `rope_theta` + `rope_scaling`
    (transformers 4) or `rope_parameters` (transformers 5)."""
    parameters = keys.get("rope_parameters")
    scaling = keys.get("rope_scaling")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ValueError(f"{keys.source}: rope_parameters must be a mapping, got {parameters!r}")
    theta = keys.get("rope_theta")
    if theta is None and parameters is not None:
        theta = parameters.get("rope_theta")
    rope_dict = scaling if scaling is not None else parameters
    name = "rope_scaling" if scaling is not None else "rope_parameters"  # the key errors name
    partial = keys.get("partial_rotary_factor")
    if partial is None and isinstance(rope_dict, Mapping):
        partial = rope_dict.get("partial_rotary_factor")
    return {
        "rope_theta": float(theta if theta is not None else theta_default),
        "rope_scaling": _rope_scaling(rope_dict, keys, fields, name),
        "partial_rotary_factor": float(partial if partial is not None else 1.0),
    }


def _rope_scaling(
    scaling: Mapping[str, Any] | None, keys: _Keys, fields: Mapping[str, Any], name: str
) -> RopeScaling | None:
    """The scaling of the rope dict found under the config key `name` (named in errors)."""
    source = keys.source
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise ValueError(f"{source}: {name} must be a mapping, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in _ROPE_KEYS:
        raise ValueError(
            f"{source}: {name} type {rope_type!r} is not supported; supported: "
            f"{', '.join(_ROPE_KEYS)}"
        )
    unknown = sorted(set(scaling) - _ROPE_KEYS[rope_type] - _ROPE_COMMON_KEYS)
    if unknown:
        raise ValueError(f"{source}: {name} of type {rope_type} has keys batchgen does not implement: {unknown}")
    if rope_type == "default":
        return None
    max_positions = int(fields["max_position_embeddings"])
    # transformers: a top-level original_max_position_embeddings (Phi-3's, 4096 when absent)
    # overrides the dict's, for llama3, yarn and longrope alike (`standardize_rope_params`).
    top_level = keys.get("original_max_position_embeddings", _TOP_LEVEL_ORIGINAL.get(keys.architecture))
    original = int(top_level or scaling.get("original_max_position_embeddings") or max_positions)

    def need(key: str) -> Any:
        if scaling.get(key) is None:
            raise ValueError(f"{source}: {name} of type {rope_type} lacks {key!r}")
        return scaling[key]

    def optional_float(key: str) -> float | None:
        value = scaling.get(key)
        return None if value is None else float(value)

    if rope_type == "linear":
        return RopeScaling(rope_type="linear", factor=float(need("factor")))
    if rope_type == "dynamic":
        # transformers' dynamic NTK grows the base past the config's max_position_embeddings.
        return RopeScaling(
            rope_type="dynamic", factor=float(need("factor")), original_max_position_embeddings=max_positions
        )
    if rope_type == "llama3":
        return RopeScaling(
            rope_type="llama3",
            factor=float(need("factor")),
            low_freq_factor=float(need("low_freq_factor")),
            high_freq_factor=float(need("high_freq_factor")),
            original_max_position_embeddings=original,
        )
    factor = scaling.get("factor")
    factor = float(factor) if factor is not None else max_positions / original
    if rope_type == "yarn":
        truncate = scaling.get("truncate", True)
        return RopeScaling(
            rope_type="yarn",
            factor=factor,
            original_max_position_embeddings=original,
            beta_fast=float(scaling.get("beta_fast") or 32.0),
            beta_slow=float(scaling.get("beta_slow") or 1.0),
            mscale=optional_float("mscale"),
            mscale_all_dim=optional_float("mscale_all_dim"),
            attention_factor=optional_float("attention_factor"),
            truncate=truncate if isinstance(truncate, bool) else bool(truncate),
        )
    return RopeScaling(
        rope_type="longrope",
        factor=factor,
        original_max_position_embeddings=original,
        attention_factor=optional_float("attention_factor"),
        short_factor=tuple(float(x) for x in need("short_factor")),
        long_factor=tuple(float(x) for x in need("long_factor")),
    )


# ---------------------------------------------------------------- per-architecture readers


def _activation(keys: _Keys, key: str = "hidden_act", default: str = "silu") -> str:
    return str(keys.get(key, default))


def _windowed_layers(window: int | None, layer_types: list[str] | None) -> dict[str, Any]:
    """sliding_window / layer_types fields: () when every layer or none slides."""
    if window is None or layer_types is None:
        return {"sliding_window": None if window is None else int(window), "layer_types": ()}
    kinds = set(layer_types)
    if kinds <= {"full_attention"}:
        return {"sliding_window": None, "layer_types": ()}
    if kinds == {"sliding_attention"}:
        return {"sliding_window": int(window), "layer_types": ()}
    return {"sliding_window": int(window), "layer_types": tuple(layer_types)}


def _layer_types(keys: _Keys, num_layers: int, derive: Callable[[int], bool]) -> list[str]:
    given = keys.get("layer_types")
    if given is not None:
        return list(given)
    return ["sliding_attention" if derive(i) else "full_attention" for i in range(num_layers)]


def _read_llama(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    keys.neutral("mlp_bias", False)
    # nanotron's rotary layout (SmolLM2): transformers always rotates halves, which is False.
    keys.neutral("rope_interleaved", False)
    keys.ignore("sliding_window")  # LlamaConfig has none; transformers ignores it
    bias = bool(keys.get("attention_bias", False))
    return {"hidden_act": _activation(keys), "qkv_bias": bias, "attention_out_bias": bias}


def _read_mistral(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    return {"hidden_act": _activation(keys), **_windowed_layers(keys.get("sliding_window"), None)}


def _qwen_windows(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    window = keys.get("sliding_window")
    window = window if keys.get("use_sliding_window", False) else None
    first = keys.get("max_window_layers", 28)
    types = _layer_types(keys, fields["num_layers"], lambda i: window is not None and i >= first)
    return _windowed_layers(window, types)


def _read_qwen2(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    # Multimodal rotary sections (Qwen2-VL); Qwen2.5 base configs carry it false.
    keys.neutral("use_mrope", False)
    return {"hidden_act": _activation(keys), "qkv_bias": True, **_qwen_windows(keys, fields)}


def _read_qwen3(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    bias = bool(keys.get("attention_bias", False))
    return {
        "hidden_act": _activation(keys),
        "qkv_bias": bias,
        "attention_out_bias": bias,
        "qk_norm": True,
        **_qwen_windows(keys, fields),
    }


def _read_qwen3_moe(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    keys.ignore("max_window_layers")  # transformers' Qwen3-MoE slides every layer or none
    window = keys.get("sliding_window")
    window = window if keys.get("use_sliding_window", False) else None
    bias = bool(keys.get("attention_bias", False))
    num_experts = keys.get("num_experts", keys.get("num_local_experts", 128))
    step = keys.get("decoder_sparse_step", 1)
    only_dense = set(keys.get("mlp_only_layers", []))
    dense = tuple(
        i for i in range(fields["num_layers"])
        if i in only_dense or not (num_experts > 0 and (i + 1) % step == 0)
    )  # fmt: skip
    return {
        "hidden_act": _activation(keys),
        "qkv_bias": bias,
        "attention_out_bias": bias,
        "qk_norm": True,
        **_windowed_layers(window, None),
        "num_experts": num_experts,
        "num_experts_per_tok": keys.get("num_experts_per_tok", 8),
        "moe_intermediate_size": keys.get("moe_intermediate_size", 768),
        "norm_topk_prob": bool(keys.get("norm_topk_prob", False)),
        "dense_layers": dense,
    }


def _read_mixtral(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "hidden_act": _activation(keys),
        **_windowed_layers(keys.get("sliding_window"), None),
        "num_experts": keys.get("num_local_experts", keys.get("num_experts", 8)),
        "num_experts_per_tok": keys.get("num_experts_per_tok", 2),
        "moe_intermediate_size": fields["intermediate_size"],
        "norm_topk_prob": True,  # Mixtral always renormalises its top-k weights
    }


def _read_gemma_common(keys: _Keys, fields: Mapping[str, Any], *, pattern: int) -> dict[str, Any]:
    keys.neutral("use_bidirectional_attention", False)
    keys.ignore("hidden_act")  # transformers' Gemma reads hidden_activation only
    bias = bool(keys.get("attention_bias", False))
    types = _layer_types(keys, fields["num_layers"], lambda i: bool((i + 1) % pattern))
    window = keys.get("sliding_window", 4096)
    # Gemma 2 9B/27B repeat the window as sliding_window_size, which transformers never reads;
    # accepted only when it agrees with sliding_window.
    keys.neutral("sliding_window_size", window)
    return {
        "hidden_act": _activation(keys, "hidden_activation", "gelu_pytorch_tanh"),
        "qkv_bias": bias,
        "attention_out_bias": bias,
        "query_pre_attn_scalar": float(keys.get("query_pre_attn_scalar", 256)),
        **_windowed_layers(window, types),
    }


def _read_gemma2(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **_read_gemma_common(keys, fields, pattern=2),
        "attn_logit_softcap": keys.get_or("attn_logit_softcapping", 50.0),
        "final_logit_softcap": keys.get_or("final_logit_softcapping", 30.0),
    }


def _read_gemma3(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    pattern = keys.get("sliding_window_pattern", keys.get("_sliding_window_pattern", 6))
    out = {
        **_read_gemma_common(keys, fields, pattern=int(pattern)),
        "attn_logit_softcap": keys.get("attn_logit_softcapping"),
        "final_logit_softcap": keys.get("final_logit_softcapping"),
        "qk_norm": True,
    }
    # Two rotary tables: rope_parameters {"full_attention": ..., "sliding_attention": ...}
    # (transformers 5) or rope_theta + rope_scaling (global) and rope_local_base_freq.
    parameters = keys.get("rope_parameters")
    local_theta = keys.get("rope_local_base_freq")
    if isinstance(parameters, Mapping) and set(parameters) <= {"full_attention", "sliding_attention"}:
        full = dict(parameters.get("full_attention") or {})
        local = dict(parameters.get("sliding_attention") or {})
        if local.get("rope_type", local.get("type", "default")) != "default":
            raise ValueError(f"{keys.source}: rope_parameters.sliding_attention must be of type default for gemma3_text")
        if local_theta is None:
            local_theta = local.get("rope_theta")
        theta = keys.get("rope_theta", full.get("rope_theta", _DEFAULTS["gemma3_text"][0]))
        given = keys.get("rope_scaling")
        scaling_dict, name = (
            (given, "rope_scaling") if given is not None else (full, "rope_parameters.full_attention")
        )
        out["rope_theta"] = float(theta)
        out["rope_scaling"] = _rope_scaling(scaling_dict, keys, fields, name)
    else:
        out.update(_rope(keys, fields, _DEFAULTS["gemma3_text"][0]))
    out["rope_local_theta"] = float(local_theta if local_theta is not None else _GEMMA3_LOCAL_THETA)
    return out


def _read_phi3(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    # Flags of Phi-4-mini's remote code, at the values that leave the model as transformers runs it.
    keys.neutral("attention_bias", False)
    keys.neutral("mlp_bias", False)
    keys.neutral("lm_head_bias", False)
    keys.neutral("full_attn_mod", 1)
    keys.neutral("interpolate_factor", 1)
    keys.get("original_max_position_embeddings")  # read by _rope_scaling
    return {"hidden_act": _activation(keys), **_windowed_layers(keys.get("sliding_window"), None)}


def _read_smollm3(keys: _Keys, fields: Mapping[str, Any]) -> dict[str, Any]:
    keys.neutral("mlp_bias", False)
    keys.ignore("max_window_layers")  # in SmolLM3's config.json; transformers does not use it
    num_layers = fields["num_layers"]
    interval = keys.get("no_rope_layer_interval", 4)
    uses_rope = keys.get("no_rope_layers")
    if uses_rope is None:
        uses_rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(uses_rope) != num_layers:
        raise ValueError(f"{keys.source}: no_rope_layers lists {len(uses_rope)} layers, the model has {num_layers}")
    window = keys.get("sliding_window")
    use_window = bool(keys.get("use_sliding_window", False))
    types = _layer_types(keys, num_layers, lambda i: use_window and window is not None and not uses_rope[i])
    bias = bool(keys.get("attention_bias", False))
    return {
        "hidden_act": _activation(keys),
        "qkv_bias": bias,
        "attention_out_bias": bias,
        "nope_layers": tuple(i for i, rope in enumerate(uses_rope) if not rope),
        **_windowed_layers(window if use_window else None, types),
    }


_READERS: dict[str, Callable[[_Keys, Mapping[str, Any]], dict[str, Any]]] = {
    "llama": _read_llama,
    "mistral": _read_mistral,
    "qwen2": _read_qwen2,
    "qwen3": _read_qwen3,
    "qwen3_moe": _read_qwen3_moe,
    "mixtral": _read_mixtral,
    "gemma2": _read_gemma2,
    "gemma3_text": _read_gemma3,
    "phi3": _read_phi3,
    "smollm3": _read_smollm3,
}
