"""GGUF metadata -> `ModelConfig`, one reader per llama.cpp architecture.

`general.architecture` names llama.cpp's architecture and the metadata keys are llama.cpp's
(`{arch}.embedding_length`, `{arch}.attention.head_count`, ...). Each is read into the
`ModelConfig` the Hugging Face folder the file was converted from gives (`hf_config`), so the same
family module runs it:

    GGUF        ModelConfig.architecture   written by convert_hf_to_gguf.py from
    llama       llama, or mixtral          Llama, Mistral, SmolLM2; Mixtral (expert_count > 0)
    qwen2       qwen2                      Qwen2 / Qwen2.5
    qwen3       qwen3                      Qwen3
    qwen3moe    qwen3_moe                  Qwen3-MoE
    gemma2      gemma2                     Gemma 2
    gemma3      gemma3_text                Gemma 3 (text)
    phi3        phi3                       Phi-3, Phi-4-mini
    smollm3     smollm3                    SmolLM3

What the file does not carry is what llama.cpp itself assumes for the architecture: Gemma 2
slides on every other layer and Gemma 3 on five of six (unless `attention.sliding_window_pattern`
says otherwise), Gemma 3's sliding layers use base 10000 (unless `rope.freq_base_swa`), Gemma's
score scale is `head_dim ** -0.5` (`hidden / heads` for the 27B models: 46 and 62 layers),
SmolLM3 has no rotary embedding on every fourth layer, Mixtral and Qwen3-MoE renormalise their
top-k expert weights (unless `expert_weights_norm` says otherwise), and every Qwen3-MoE layer has
experts. Phi-3's `attention.sliding_window` (0: none) is applied to every layer, as transformers
applies it (llama.cpp currently ignores it). Rope scaling is `gguf_rope`'s; partial rotary
(`rope.dimension_count` < head_dim) is read for the architectures stored unpermuted. Floats are
read back as `gguf_rope.float32_decimal` gives them.

Missing required metadata, a feature key no reader here reads (a sliding window on Qwen3, soft
caps on Llama, ...), or a key set away from its neutral value (shared experts, a logit scale,
sigmoid gating, ...) raises ValueError naming the file and the key: batchgen refuses to guess.

Imports `batchgen.models.config`, `gguf_rope` and `gguf_tensors`; `gguf` only for types.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from batchgen.models.config import ModelConfig
from batchgen.models.gguf_rope import float32_decimal, rope_scaling
from batchgen.models.gguf_tensors import PERMUTED_QK_ARCHITECTURES

if TYPE_CHECKING:
    from pathlib import Path

    from batchgen.tokenizer.gguf_vocab import GGUFSource

__all__ = ["GGUF_ARCHITECTURES", "GGUFMetadata", "gguf_architecture", "read_gguf_config"]

# llama.cpp's constants for what Gemma's files do not carry.
_GEMMA2_WINDOW = 4096
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
_GEMMA3_LOCAL_THETA = 10000.0
_SMOLLM3_NOPE_INTERVAL = 4
_DEFAULT_ROPE_THETA = 10000.0  # llama.cpp's default rope.freq_base

# Keys (after "{arch}.") that name a feature: an architecture's reader reads the ones it has;
# any other one present is an error. 0 counts as absent for the sliding window (Phi-3's "none").
_FEATURE_KEYS = (
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "rope.freq_base_swa",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_weights_norm",
)
# Keys accepted only at a neutral value (or absent): features batchgen does not implement.
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "expert_shared_count": (0,),
    "expert_weights_scale": (0.0, 1.0),  # 0: llama.cpp's "unset"
    "expert_gating_func": (1,),  # gguf.ExpertGatingFuncType.SOFTMAX
    "expert_group_count": (0,),
    "leading_dense_block_count": (0,),
    "logit_scale": (1.0,),
    "embedding_scale": (),
    "residual_scale": (),
    "attention.scale": (),
    "attention.causal": (True,),
    "attention.layer_norm_epsilon": (),  # LayerNorm, not RMSNorm
    "use_parallel_residual": (False,),
    "rope.dimension_sections": (),  # multimodal rope sections
}


class GGUFMetadata:
    """`{arch}.*` metadata of one file, with a record of the feature keys read."""

    def __init__(self, reader: GGUFSource, path: Path, arch: str) -> None:
        self.reader = reader
        self.path = path
        self.arch = arch
        self._read: set[str] = set()

    def raw(self, key: str) -> Any:
        self._read.add(key)
        field = self.reader.fields.get(f"{self.arch}.{key}")
        return None if field is None else field.contents()

    def int_or_none(self, key: str) -> int | None:
        """An int; a per-layer list only when all entries agree."""
        value = self.raw(key)
        if isinstance(value, list):
            if not value or len(set(value)) != 1:
                raise ValueError(
                    f"{self.path}: {self.arch}.{key} differs between layers ({value!r}); not supported"
                )
            value = value[0]
        return None if value is None else int(value)

    def int_(self, key: str) -> int:
        value = self.int_or_none(key)
        if value is None:
            raise ValueError(f"{self.path}: missing metadata key {self.arch}.{key}")
        return value

    def float_or_none(self, key: str) -> float | None:
        value = self.raw(key)
        return None if value is None else float32_decimal(value)

    def float_(self, key: str) -> float:
        value = self.float_or_none(key)
        if value is None:
            raise ValueError(f"{self.path}: missing metadata key {self.arch}.{key}")
        return value

    def check(self) -> None:
        """Raise for a feature key present but read by no reader, or a non-neutral value."""
        for key in _FEATURE_KEYS:
            if key in self._read:
                continue
            value = self.raw(key)
            if value is not None and not (key == "attention.sliding_window" and value == 0):
                raise ValueError(
                    f"{self.path}: {self.arch}.{key} = {value!r} is set, but batchgen's {self.arch} "
                    "reader has no such feature (nor does llama.cpp's); refusing to guess"
                )
        for key, neutral in _NEUTRAL.items():
            value = self.raw(key)
            if value is not None and value not in neutral:
                raise ValueError(
                    f"{self.path}: {self.arch}.{key} = {value!r} is not supported "
                    f"(supported: {' or '.join(repr(v) for v in neutral) or 'absent'})"
                )


def gguf_architecture(reader: GGUFSource, path: Path) -> str:
    """`general.architecture`; ValueError naming the file, it and the supported ones."""
    field = reader.fields.get("general.architecture")
    arch = None if field is None else field.contents()
    if arch not in _READERS:
        raise ValueError(
            f"{path}: general.architecture {arch!r} is not supported for GGUF; supported: "
            f"{', '.join(GGUF_ARCHITECTURES)}"
        )
    return str(arch)


def read_gguf_config(
    reader: GGUFSource, path: Path, *, tokenizer_vocab_size: int | None = None
) -> ModelConfig:
    """ModelConfig from the file's metadata and tensor list (module docstring).

    `tokenizer_vocab_size` (the length of `tokenizer.ggml.tokens`) wins over `{arch}.vocab_size`.
    Raises ValueError naming `path` and the key for an unsupported architecture, a missing
    required key, or a feature batchgen does not implement.
    """
    arch = gguf_architecture(reader, path)
    meta = GGUFMetadata(reader, path, arch)
    tensor_names = {tensor.name for tensor in reader.tensors}
    hidden_size = meta.int_("embedding_length")
    num_heads = meta.int_("attention.head_count")
    head_dim = meta.int_or_none("attention.key_length") or hidden_size // num_heads
    value_dim = meta.int_or_none("attention.value_length")
    if value_dim is not None and value_dim != head_dim:
        raise ValueError(
            f"{path}: {arch}.attention.value_length {value_dim} differs from key_length {head_dim}; not supported"
        )
    rotary_dim = meta.int_or_none("rope.dimension_count") or head_dim
    if rotary_dim != head_dim and arch in PERMUTED_QK_ARCHITECTURES:
        raise ValueError(
            f"{path}: {arch}.rope.dimension_count {rotary_dim} differs from head_dim {head_dim}; "
            f"partial rotary embeddings are not supported for {arch}"
        )
    vocab_size = tokenizer_vocab_size or meta.int_or_none("vocab_size")
    if vocab_size is None:
        raise ValueError(f"{path}: neither tokenizer.ggml.tokens nor {arch}.vocab_size is present")
    fields: dict[str, Any] = {
        "architecture": _ARCHITECTURE_NAMES[arch],
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": meta.int_("feed_forward_length"),
        "num_layers": meta.int_("block_count"),
        "num_heads": num_heads,
        "num_kv_heads": meta.int_or_none("attention.head_count_kv") or num_heads,
        "head_dim": head_dim,
        "rms_norm_eps": meta.float_("attention.layer_norm_rms_epsilon"),
        "rope_theta": meta.float_or_none("rope.freq_base") or _DEFAULT_ROPE_THETA,
        "max_position_embeddings": meta.int_("context_length"),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "qkv_bias": "blk.0.attn_q.bias" in tensor_names,
        "attention_out_bias": "blk.0.attn_output.bias" in tensor_names,
        "partial_rotary_factor": rotary_dim / head_dim,
        **_special_tokens(reader),
    }
    fields.update(_READERS[arch](meta, fields, tensor_names))
    fields["rope_scaling"] = rope_scaling(
        meta,
        rotary_dim=rotary_dim,
        rope_theta=fields["rope_theta"],
        max_positions=fields["max_position_embeddings"],
        tensors=tensor_names,
    )
    meta.check()
    return ModelConfig(**fields)


def _special_tokens(reader: GGUFSource) -> dict[str, Any]:
    def token(key: str) -> int | None:
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        return None if field is None else int(field.contents())

    eos_ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token_id = token(key)
        if token_id is not None and token_id not in eos_ids:
            eos_ids.append(token_id)
    return {"bos_token_id": token("bos_token_id"), "eos_token_ids": tuple(eos_ids)}


# ---------------------------------------------------------------- per-architecture readers

_Reader = Callable[[GGUFMetadata, dict[str, Any], set[str]], dict[str, Any]]


def _experts(meta: GGUFMetadata, expert_ffn: int) -> dict[str, Any]:
    return {
        "num_experts": meta.int_("expert_count"),
        "num_experts_per_tok": meta.int_("expert_used_count"),
        "moe_intermediate_size": expert_ffn,
    }


def _read_llama(meta: GGUFMetadata, fields: dict[str, Any], tensors: set[str]) -> dict[str, Any]:
    if not meta.int_or_none("expert_count"):
        return {}
    ffn = meta.int_or_none("expert_feed_forward_length") or fields["intermediate_size"]
    # llama.cpp's llama graph always renormalises the top-k weights, as Mixtral does.
    return {"architecture": "mixtral", **_experts(meta, ffn), "norm_topk_prob": True}


def _read_qwen3(meta: GGUFMetadata, fields: dict[str, Any], tensors: set[str]) -> dict[str, Any]:
    return {"qk_norm": True}


def _read_qwen3moe(meta: GGUFMetadata, fields: dict[str, Any], tensors: set[str]) -> dict[str, Any]:
    norm = meta.raw("expert_weights_norm")
    experts = _experts(meta, meta.int_("expert_feed_forward_length"))
    dense = [
        i for i in range(fields["num_layers"]) if f"blk.{i}.ffn_gate_inp.weight" not in tensors
    ]
    if dense:
        # The converter maps no dense MLP for qwen3moe, and llama.cpp runs experts on every layer.
        raise ValueError(
            f"{meta.path}: blk.{dense[0]}.ffn_gate_inp.weight is missing; qwen3moe layers without "
            "experts (mlp_only_layers) are not supported in GGUF"
        )
    return {
        "qk_norm": True,
        **experts,
        "norm_topk_prob": True if norm is None else bool(norm),
    }


def _sliding_layers(meta: GGUFMetadata, num_layers: int, llama_cpp_pattern: int) -> list[bool]:
    """Which layers slide: `attention.sliding_window_pattern` (a list of booleans, or a period n:
    layer i slides when i % n < n - 1, llama.cpp's rule) or llama.cpp's period for the arch."""
    pattern = meta.raw("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ValueError(
                f"{meta.path}: {meta.arch}.attention.sliding_window_pattern lists {len(pattern)} layers, "
                f"the model has {num_layers}"
            )
        return [bool(p) for p in pattern]
    period = llama_cpp_pattern if pattern is None else int(pattern)
    return [period == 0 or i % period < period - 1 for i in range(num_layers)]


def _windows(window: int | None, sliding: list[bool]) -> dict[str, Any]:
    """sliding_window / layer_types as the Hugging Face reader gives them: () when every layer
    or none slides."""
    if window is None or not any(sliding):
        return {"sliding_window": None, "layer_types": ()}
    if all(sliding):
        return {"sliding_window": window, "layer_types": ()}
    return {
        "sliding_window": window,
        "layer_types": tuple("sliding_attention" if s else "full_attention" for s in sliding),
    }


def _gemma_common(meta: GGUFMetadata, fields: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp scales scores by head_dim ** -0.5, by (hidden / heads) ** -0.5 for the 27B models
    # (query_pre_attn_scalar of their config.json; GGUF does not carry it).
    is_27b = fields["num_layers"] == _GEMMA_27B_LAYERS[meta.arch]
    scalar = fields["hidden_size"] // fields["num_heads"] if is_27b else fields["head_dim"]
    return {"hidden_act": "gelu_pytorch_tanh", "query_pre_attn_scalar": float(scalar)}


def _read_gemma2(meta: GGUFMetadata, fields: dict[str, Any], tensors: set[str]) -> dict[str, Any]:
    window = meta.int_or_none("attention.sliding_window") or _GEMMA2_WINDOW
    attn_cap = meta.float_or_none("attn_logit_softcapping")
    final_cap = meta.float_or_none("final_logit_softcapping")
    return {
        **_gemma_common(meta, fields),
        **_windows(window, _sliding_layers(meta, fields["num_layers"], 2)),
        "attn_logit_softcap": 50.0 if attn_cap is None else attn_cap,  # llama.cpp's defaults
        "final_logit_softcap": 30.0 if final_cap is None else final_cap,
    }


def _read_gemma3(meta: GGUFMetadata, fields: dict[str, Any], tensors: set[str]) -> dict[str, Any]:
    window = meta.int_or_none("attention.sliding_window") or None  # absent or 0: no sliding layers
    local_theta = meta.float_or_none("rope.freq_base_swa")
    return {
        **_gemma_common(meta, fields),
        **_windows(window, _sliding_layers(meta, fields["num_layers"], 6)),
        "qk_norm": True,
        "attn_logit_softcap": meta.float_or_none("attn_logit_softcapping"),
        "final_logit_softcap": meta.float_or_none("final_logit_softcapping"),
        "rope_local_theta": _GEMMA3_LOCAL_THETA if local_theta is None else local_theta,
    }


def _read_phi3(meta: GGUFMetadata, fields: dict[str, Any], tensors: set[str]) -> dict[str, Any]:
    window = meta.int_or_none("attention.sliding_window") or None  # the converter writes 0 for none
    return _windows(window, [True] * fields["num_layers"])


def _read_smollm3(meta: GGUFMetadata, fields: dict[str, Any], tensors: set[str]) -> dict[str, Any]:
    nope = tuple(i for i in range(fields["num_layers"]) if (i + 1) % _SMOLLM3_NOPE_INTERVAL == 0)
    return {"nope_layers": nope}


def _read_plain(meta: GGUFMetadata, fields: dict[str, Any], tensors: set[str]) -> dict[str, Any]:
    return {}


_READERS: dict[str, _Reader] = {
    "llama": _read_llama,
    "qwen2": _read_plain,
    "qwen3": _read_qwen3,
    "qwen3moe": _read_qwen3moe,
    "gemma2": _read_gemma2,
    "gemma3": _read_gemma3,
    "phi3": _read_phi3,
    "smollm3": _read_smollm3,
}
_ARCHITECTURE_NAMES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "smollm3": "smollm3",
}
GGUF_ARCHITECTURES: tuple[str, ...] = tuple(_READERS)
