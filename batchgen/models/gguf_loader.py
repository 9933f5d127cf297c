"""Reading a GGUF file into a config, Hugging Face-named weights and a tokenizer.

GGUF files of these llama.cpp architectures (`general.architecture`) load, as llama.cpp's
converter (`convert_hf_to_gguf.py`) writes them from Hugging Face checkpoints: `llama` (Llama,
Mistral, SmolLM2, and Mixtral when it has experts), `qwen2`, `qwen3`, `qwen3moe`, `gemma2`,
`gemma3` (text), `phi3` (Phi-3, Phi-4-mini) and `smollm3`. Each loads as the `ModelConfig` and
Hugging Face-named weights its Hugging Face folder gives, so the same family module runs it:

- `gguf_config` reads the config from llama.cpp's `{arch}.*` metadata keys (and the rope tensors
  `rope_freqs`, `rope_factors_long/short`), filling in what llama.cpp assumes per architecture;
- `gguf_tensors` dequantizes every tensor (`gguf.quants`: F32, F16, BF16, Q8_0, the K-quants,
  ...) to float32, casts it to the requested dtype and renames it, undoing what the converter
  did: Q/K rows permuted back for `llama` / `smollm3`, Gemma's stored `w + 1` norms back to `w`,
  stacked experts split per expert;
- the tokenizer comes from `tokenizer.ggml.*` (`batchgen.tokenizer.tokenizer`): byte-level BPE
  (`gpt2`) or SentencePiece BPE (`llama`: Llama 2, Mistral, Mixtral, Phi-3-mini, Gemma); another
  `tokenizer.ggml.model` is refused there, naming the key.

An unsupported architecture, a missing required key, or a feature batchgen does not implement
raises ValueError naming the file and the architecture or key.

Imports torch, `batchgen.models.config`, `gguf_config`, `gguf_tensors` and
`batchgen.tokenizer.tokenizer`; `gguf` only when a file is read, so that importing this module,
and loading a Hugging Face folder through `checkpoint`, works where the package is missing (the
GPU machine has no gguf). Reading a .gguf file without it raises ImportError naming the file and
the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from batchgen.models.config import ModelConfig
from batchgen.models.gguf_config import gguf_architecture, read_gguf_config
from batchgen.models.gguf_tensors import hf_weights, import_gguf
from batchgen.tokenizer.tokenizer import Tokenizer

__all__ = ["GGUFContents", "load_gguf", "read_gguf_config"]


@dataclass(frozen=True, slots=True)
class GGUFContents:
    """What a GGUF file holds, in our terms (weights already dequantized and renamed)."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer


def load_gguf(path: Path, *, dtype: torch.dtype) -> GGUFContents:
    """Read config, tokenizer and all weights (dequantized, renamed, as `dtype`).

    Raises ValueError naming `path` for an unsupported architecture, metadata key, tensor name or
    type, and ImportError naming it when the `gguf` package is not installed.
    """
    gguf_package = import_gguf(path)
    try:
        reader = gguf_package.GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path}: not a readable GGUF file: {exc}") from exc
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    config = read_gguf_config(
        reader, path, tokenizer_vocab_size=None if tokens is None else len(tokens.contents())
    )
    tokenizer = Tokenizer.from_gguf(reader)
    weights = hf_weights(reader, path, gguf_architecture(reader, path), config, dtype=dtype)
    return GGUFContents(config=config, weights=weights, tokenizer=tokenizer)
