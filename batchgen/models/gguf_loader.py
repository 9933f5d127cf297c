"""Reading a llama-architecture GGUF file into a config, Hugging Face-named weights and a tokenizer.

The config comes from `llama.*` metadata, the tokenizer from `tokenizer.ggml.*` (see
`batchgen.tokenizer.tokenizer`). Every tensor is dequantized with `gguf.quants.dequantize` to float32, then
cast to the requested dtype, and renamed to Hugging Face Llama names:

    token_embd -> model.embed_tokens      blk.N.attn_q/k/v -> model.layers.N.self_attn.q/k/v_proj
    output_norm -> model.norm             blk.N.attn_output -> ...self_attn.o_proj
    output -> lm_head (absent: tied)      blk.N.ffn_gate/up/down -> ...mlp.gate/up/down_proj
                                          blk.N.attn_norm / ffn_norm -> ...input/post_attention_layernorm

llama.cpp's converter permutes the rows of Q and K so that GGML's rope rotates adjacent pairs;
they are permuted back here (as transformers does) so Hugging Face's `rotate_half` rope applies.
GGUF lists dimensions fastest-first (ne0 first), so a matrix of `shape` [in, out] is read as
(out, in). A `rope_freqs` tensor (llama 3 rope scaling) is turned back into `RopeScaling`.

Imports numpy, torch, `batchgen.models.config` and `batchgen.tokenizer.tokenizer`; `gguf` only when
a file is read (`_import_gguf`), so that importing this module, and loading a Hugging Face folder
through `checkpoint`, works where the package is missing (the GPU machine has no gguf). Reading a
.gguf file without it raises ImportError naming the file and the package.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from batchgen.models.config import ModelConfig, RopeScaling
from batchgen.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:
    import gguf

__all__ = ["GGUFContents", "load_gguf", "read_gguf_config"]

_SUPPORTED = ("llama",)

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_ROPE_FREQS = "rope_freqs.weight"

# Llama 3.x rope-scaling constants that GGUF metadata does not carry; checked against rope_freqs.
_LLAMA3_LOW_FREQ_FACTOR = 1.0
_LLAMA3_HIGH_FREQ_FACTOR = 4.0
_LLAMA3_ORIGINAL_CONTEXT = 8192


def _import_gguf(path: Path) -> ModuleType:
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


@dataclass(frozen=True, slots=True)
class GGUFContents:
    """What a GGUF file holds, in our terms (weights already dequantized and renamed)."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _uniform_int(path: Path, key: str, value: Any) -> int | None:
    """An int metadata value; a per-layer list is accepted only when all entries agree."""
    if value is None:
        return None
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            raise ValueError(f"{path}: {key} differs between layers ({value!r}); not supported")
        value = value[0]
    return int(value)


def read_gguf_config(
    reader: gguf.GGUFReader, path: Path, *, tokenizer_vocab_size: int | None = None
) -> ModelConfig:
    """ModelConfig from `llama.*` metadata and the tensor list.

    Raises ValueError naming `path` and the key when the architecture is not llama, a required key
    is missing, or a feature (partial rotary, unsupported rope scaling) is not implemented.
    """
    arch = _field(reader, "general.architecture")
    if arch not in _SUPPORTED:
        raise ValueError(
            f"{path}: general.architecture {arch!r} is not supported for GGUF; supported: "
            f"{', '.join(_SUPPORTED)}"
        )

    def required(key: str) -> int:
        value = _uniform_int(path, f"{arch}.{key}", _field(reader, f"{arch}.{key}"))
        if value is None:
            raise ValueError(f"{path}: missing metadata key {arch}.{key}")
        return value

    def optional(key: str) -> int | None:
        return _uniform_int(path, f"{arch}.{key}", _field(reader, f"{arch}.{key}"))

    hidden_size = required("embedding_length")
    num_heads = required("attention.head_count")
    num_kv_heads = optional("attention.head_count_kv") or num_heads
    rope_dims = optional("rope.dimension_count")
    head_dim = optional("attention.key_length") or rope_dims or hidden_size // num_heads
    if rope_dims is not None and rope_dims != head_dim:
        raise ValueError(
            f"{path}: {arch}.rope.dimension_count {rope_dims} differs from head_dim {head_dim}; "
            "partial rotary embeddings are not supported"
        )
    vocab_size = tokenizer_vocab_size or optional("vocab_size")
    if vocab_size is None:
        raise ValueError(f"{path}: neither tokenizer.ggml.tokens nor {arch}.vocab_size is present")
    tensor_names = {tensor.name for tensor in reader.tensors}
    eps = _field(reader, f"{arch}.attention.layer_norm_rms_epsilon")
    rope_theta = _field(reader, f"{arch}.rope.freq_base")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    eos_ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token_id = _field(reader, f"tokenizer.ggml.{key}")
        if token_id is not None and int(token_id) not in eos_ids:
            eos_ids.append(int(token_id))
    return ModelConfig(
        architecture="llama",
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=required("feed_forward_length"),
        num_layers=required("block_count"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=1e-5 if eps is None else float(eps),
        rope_theta=10000.0 if rope_theta is None else float(rope_theta),
        rope_scaling=_rope_scaling(reader, path, arch, head_dim, rope_theta or 10000.0),
        max_position_embeddings=optional("context_length") or 2048,
        tie_word_embeddings="output.weight" not in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(eos_ids),
    )


def _rope_scaling(
    reader: gguf.GGUFReader, path: Path, arch: str, head_dim: int, rope_theta: float
) -> RopeScaling | None:
    kind = _field(reader, f"{arch}.rope.scaling.type")
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    freqs = next((t for t in reader.tensors if t.name == _ROPE_FREQS), None)
    if freqs is not None:
        return _llama3_scaling_from_freqs(
            path, _dequantized(freqs, path).reshape(-1), head_dim, rope_theta, reader, arch
        )
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return RopeScaling(rope_type="linear", factor=float(factor))
    raise ValueError(f"{path}: {arch}.rope.scaling.type {kind!r} is not supported (none, linear)")


def _llama3_scaling_from_freqs(
    path: Path,
    freq_factors: npt.NDArray[np.float32],
    head_dim: int,
    rope_theta: float,
    reader: gguf.GGUFReader,
    arch: str,
) -> RopeScaling:
    """Recover llama3 rope parameters from llama.cpp's per-frequency divisors (`rope_freqs`)."""
    if freq_factors.shape != (head_dim // 2,):
        raise ValueError(
            f"{path}: {_ROPE_FREQS} has shape {freq_factors.shape}, expected ({head_dim // 2},)"
        )
    original = _field(reader, f"{arch}.rope.scaling.original_context_length")
    scaling = RopeScaling(
        rope_type="llama3",
        factor=float(freq_factors.max()),
        low_freq_factor=_LLAMA3_LOW_FREQ_FACTOR,
        high_freq_factor=_LLAMA3_HIGH_FREQ_FACTOR,
        original_max_position_embeddings=int(original or _LLAMA3_ORIGINAL_CONTEXT),
    )
    expected = llama3_freq_factors(scaling, head_dim, rope_theta)
    if not np.allclose(expected, freq_factors, rtol=1e-4, atol=1e-6):
        raise ValueError(
            f"{path}: {_ROPE_FREQS} does not match llama3 rope scaling with factor "
            f"{scaling.factor}; this rope scaling is not supported"
        )
    return scaling


def llama3_freq_factors(
    scaling: RopeScaling, head_dim: int, rope_theta: float
) -> npt.NDArray[np.float32]:
    """Divisor per rotary frequency (`inv_freq / scaled_inv_freq`), as llama.cpp stores it."""
    factors = np.empty(head_dim // 2, dtype=np.float32)
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    for idx in range(head_dim // 2):
        wavelen = 2 * math.pi * rope_theta ** (2 * idx / head_dim)
        if wavelen < high_wavelen:
            factors[idx] = 1.0
        elif wavelen > low_wavelen:
            factors[idx] = scaling.factor
        else:
            smooth = (
                scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor
            ) / (scaling.high_freq_factor - scaling.low_freq_factor)
            factors[idx] = 1.0 / ((1 - smooth) / scaling.factor + smooth)
    return factors


def _dequantized(tensor: gguf.ReaderTensor, path: Path) -> npt.NDArray[np.float32]:
    """float32 array in PyTorch order (ne reversed), writable and owned."""
    shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
    try:
        array: npt.NDArray[Any] = _import_gguf(path).quants.dequantize(tensor.data, tensor.tensor_type)
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
    """Undo llama.cpp's Q/K row permutation (per head: interleaved pairs -> two halves)."""
    rows = array.shape[0]
    half_head = rows // num_heads // 2
    unpermuted = array.reshape(num_heads, half_head, 2, *array.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(unpermuted.reshape(array.shape))


def _hf_name(gguf_name: str, path: Path) -> str:
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES and suffix == "weight":
        return f"{_GLOBAL_NAMES[stem]}.weight"
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is not None and match.group(2) in _LAYER_NAMES:
        layer_idx, part, kind = match.groups()
        return f"model.layers.{int(layer_idx)}.{_LAYER_NAMES[part]}.{kind}"
    raise ValueError(f"{path}: tensor {gguf_name!r} has no Hugging Face Llama counterpart")


def load_gguf(path: Path, *, dtype: torch.dtype) -> GGUFContents:
    """Read config, tokenizer and all weights (dequantized, renamed, Q/K unpermuted, as `dtype`).

    Raises ValueError naming `path` for an unsupported architecture, tensor name or type, and
    ImportError naming it when the `gguf` package is not installed.
    """
    gguf_package = _import_gguf(path)
    try:
        reader = gguf_package.GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path}: not a readable GGUF file: {exc}") from exc
    tokens = _field(reader, "tokenizer.ggml.tokens")
    config = read_gguf_config(
        reader, path, tokenizer_vocab_size=None if tokens is None else len(tokens)
    )
    tokenizer = Tokenizer.from_gguf(reader)
    weights: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        if tensor.name == _ROPE_FREQS:
            continue  # folded into config.rope_scaling
        name = _hf_name(tensor.name, path)
        array = _dequantized(tensor, path)
        if ".attn_q." in tensor.name:
            array = _unpermute_rope_rows(array, config.num_heads)
        elif ".attn_k." in tensor.name:
            array = _unpermute_rope_rows(array, config.num_kv_heads)
        weights[name] = torch.from_numpy(array).to(dtype)
    return GGUFContents(config=config, weights=weights, tokenizer=tokenizer)
