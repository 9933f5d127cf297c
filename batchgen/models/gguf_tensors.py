"""GGUF tensors -> the Hugging Face-named weights the family modules build from.

Each tensor is dequantized to float32 (`gguf.quants.dequantize`), read in PyTorch order (GGUF
lists dimensions fastest-first, so ne `[in, out]` is a `(out, in)` matrix), then undone from what
llama.cpp's converter (`convert_hf_to_gguf.py`) did to the Hugging Face weights of each
architecture (`general.architecture`):

    token_embd / output_norm / output     -> model.embed_tokens / model.norm / lm_head (absent: tied)
    blk.N.attn_q/k/v/output (.weight/.bias) -> model.layers.N.self_attn.q/k/v/o_proj
    blk.N.attn_q_norm / attn_k_norm        -> ...self_attn.q_norm / k_norm (Qwen 3, Gemma 3)
    blk.N.ffn_gate/up/down                 -> ...mlp.gate/up/down_proj
    blk.N.attn_norm, ffn_norm              -> ...input_layernorm, post_attention_layernorm
  Gemma 2 / 3 (sandwich norms; the converter stores every `*norm.weight` as w + 1, undone here):
    blk.N.post_attention_norm, ffn_norm, post_ffw_norm
                                           -> ...post_attention_layernorm,
                                              pre_feedforward_layernorm, post_feedforward_layernorm
  Phi-3 (fused, kept fused):  blk.N.attn_qkv -> ...self_attn.qkv_proj  (rows | q | k | v |)
                              blk.N.ffn_up   -> ...mlp.gate_up_proj    (rows | gate | up |)
  Experts, stacked [experts, out, in] by the converter and split again here:
    Qwen3-MoE: blk.N.ffn_gate_inp -> ...mlp.gate; ffn_gate/up/down_exps -> ...mlp.experts.E.gate/up/down_proj
    Mixtral (`llama` with experts): ffn_gate_inp -> ...block_sparse_moe.gate;
                                    ffn_gate/up/down_exps -> ...block_sparse_moe.experts.E.w1/w3/w2

For `llama` (Llama, Mistral, Mixtral, SmolLM2) and `smollm3` the converter permutes the rows of
Q and K (weights and biases) so that GGML's rope rotates adjacent pairs; they are permuted back
(as transformers does) so the `rotate_half` rope applies. The other architectures use GGML's
NeoX rope and are stored unpermuted. `rope_freqs`, `rope_factors_long` and `rope_factors_short`
are rope parameters (`gguf_config`), not weights. Any other tensor name raises ValueError naming
the file and the tensor.

Imports numpy, torch and `batchgen.models.config`; `gguf` only when a file is read
(`import_gguf`), so that importing this module works where the package is missing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from batchgen.models.config import ModelConfig

if TYPE_CHECKING:
    import gguf

__all__ = [
    "CONFIG_TENSORS",
    "PERMUTED_QK_ARCHITECTURES",
    "dequantize_tensor",
    "hf_weights",
    "import_gguf",
]

# Architectures whose converter permutes Q/K rows for GGML's interleaved ("normal") rope.
PERMUTED_QK_ARCHITECTURES = frozenset({"llama", "smollm3"})
# Tensors that hold rope parameters, read into the config.
CONFIG_TENSORS = frozenset(
    {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
)

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_ATTENTION = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_PRE_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_SANDWICH_NORMS = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_DENSE_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_PHI3_FUSED = {
    "attn_qkv": "self_attn.qkv_proj",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True, slots=True)
class _Layout:
    """How one architecture's GGUF tensors map onto its family's Hugging Face names."""

    layer_names: dict[str, str]
    router: str | None = None  # GGUF `ffn_gate_inp` -> this (experts only)
    expert_prefix: str = ""  # "mlp.experts." / "block_sparse_moe.experts."
    expert_names: dict[str, str] = field(default_factory=dict)  # ffn_*_exps -> per-expert name
    permute_qk: bool = False
    norm_offset: float = 0.0  # the converter stored norms as w + offset


_QWEN_EXPERTS = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
_MIXTRAL_EXPERTS = {"ffn_gate_exps": "w1", "ffn_up_exps": "w3", "ffn_down_exps": "w2"}


def _layout(gguf_arch: str, config: ModelConfig) -> _Layout:
    pre_norm_dense = {**_ATTENTION, **_PRE_NORMS, **_DENSE_MLP}
    if gguf_arch == "llama" and config.is_moe:
        return _Layout(
            {**_ATTENTION, **_PRE_NORMS},
            "block_sparse_moe.gate",
            "block_sparse_moe.experts.",
            _MIXTRAL_EXPERTS,
            permute_qk=True,
        )
    if gguf_arch in PERMUTED_QK_ARCHITECTURES:
        return _Layout(pre_norm_dense, permute_qk=True)
    if gguf_arch == "qwen3moe":
        return _Layout(pre_norm_dense, "mlp.gate", "mlp.experts.", _QWEN_EXPERTS)
    if gguf_arch in ("gemma2", "gemma3"):
        return _Layout({**_ATTENTION, **_SANDWICH_NORMS, **_DENSE_MLP}, norm_offset=1.0)
    if gguf_arch == "phi3":
        return _Layout({"attn_output": "self_attn.o_proj", **_PRE_NORMS, **_PHI3_FUSED})
    return _Layout(pre_norm_dense)  # qwen2, qwen3


def import_gguf(path: Path) -> ModuleType:
    """The `gguf` package (with `gguf.quants`), imported now; ImportError naming `path` without it."""
    try:
        import gguf
        import gguf.quants
    except ImportError as exc:
        raise ImportError(
            f"{path}: reading a .gguf file needs the Python package 'gguf', which is not "
            "installed (pip install 'gguf>=0.10'); a Hugging Face model folder needs no gguf",
            name="gguf",
        ) from exc
    return gguf


def dequantize_tensor(tensor: gguf.ReaderTensor, path: Path) -> npt.NDArray[np.float32]:
    """float32 array in PyTorch order (ne reversed), writable and owned; ValueError naming the
    file and the tensor for a type gguf cannot dequantize."""
    shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
    try:
        array: npt.NDArray[Any] = import_gguf(path).quants.dequantize(
            tensor.data, tensor.tensor_type
        )
    except NotImplementedError as exc:
        raise ValueError(
            f"{path}: tensor {tensor.name} has type {tensor.tensor_type.name}, which cannot be "
            "dequantized"
        ) from exc
    if array.size != math.prod(shape):
        raise ValueError(
            f"{path}: tensor {tensor.name} dequantized to {array.size} values, expected {shape}"
        )
    array = array.reshape(shape).astype(np.float32, copy=False)
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, dtype=np.float32, copy=True, order="C")
    return array


def _unpermute_rope_rows(array: npt.NDArray[np.float32], num_heads: int) -> npt.NDArray[np.float32]:
    """Undo the converter's Q/K row permutation (per head: interleaved pairs -> two halves)."""
    half_head = array.shape[0] // num_heads // 2
    unpermuted = array.reshape(num_heads, half_head, 2, *array.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(unpermuted.reshape(array.shape))


def _renamed(
    gguf_name: str, array: npt.NDArray[np.float32], layout: _Layout, config: ModelConfig, path: Path
) -> list[tuple[str, npt.NDArray[np.float32]]]:
    """The Hugging Face name(s) and array(s) of one GGUF tensor (several for stacked experts)."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES and suffix == "weight":
        if stem == "output_norm" and layout.norm_offset:
            array = array - np.float32(layout.norm_offset)
        return [(f"{_GLOBAL_NAMES[stem]}.weight", array)]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None:
        raise ValueError(f"{path}: tensor {gguf_name!r} has no Hugging Face counterpart")
    layer_idx, part, kind = int(match.group(1)), match.group(2), match.group(3)
    prefix = f"model.layers.{layer_idx}."
    if part in layout.expert_names and kind == "weight":
        if array.ndim != 3 or array.shape[0] != config.num_experts:
            raise ValueError(
                f"{path}: tensor {gguf_name} has shape {array.shape}, expected "
                f"[{config.num_experts}, out, in] (expert_count {config.num_experts})"
            )
        name = layout.expert_names[part]
        return [
            (f"{prefix}{layout.expert_prefix}{e}.{name}.weight", np.ascontiguousarray(array[e]))
            for e in range(config.num_experts)
        ]
    if part == "ffn_gate_inp" and layout.router is not None and kind == "weight":
        return [(f"{prefix}{layout.router}.weight", array)]
    if part not in layout.layer_names:
        raise ValueError(
            f"{path}: tensor {gguf_name!r} has no Hugging Face counterpart for this architecture"
        )
    if layout.permute_qk and part == "attn_q":
        array = _unpermute_rope_rows(array, config.num_heads)
    elif layout.permute_qk and part == "attn_k":
        array = _unpermute_rope_rows(array, config.num_kv_heads)
    if layout.norm_offset and part.endswith("norm"):
        array = array - np.float32(layout.norm_offset)
    return [(f"{prefix}{layout.layer_names[part]}.{kind}", array)]


def hf_weights(
    reader: gguf.GGUFReader, path: Path, gguf_arch: str, config: ModelConfig, *, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Every weight of the file (but `CONFIG_TENSORS`) by Hugging Face name, as `dtype`.

    `gguf_arch` is the file's `general.architecture`, `config` what `gguf_config` read from it.
    Raises ValueError naming `path` for a tensor name, shape or type that cannot be mapped.
    """
    layout = _layout(gguf_arch, config)
    weights: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        if tensor.name in CONFIG_TENSORS:
            continue
        array = dequantize_tensor(tensor, path)
        for name, part in _renamed(tensor.name, array, layout, config, path):
            weights[name] = torch.from_numpy(part).to(dtype)
    return weights
