"""A random-weight Llama as a Hugging Face folder that batchgen and vLLM both load (issue 25).

usage: python jobs/bench/random_model.py OUT_DIR [--shape llama-3.2-1b|tiny] [--seed 0]

Benchmarks at a size users run: `llama-3.2-1b` has Llama-3.2-1B's config (hidden 2048, 16
layers, 32 query and 8 KV heads of 64, MLP 8192, llama3 rope scaling, 128,256-token vocabulary,
tied embeddings): 1,235,814,400 parameters, 4.9 GB in float32. `tiny` is the same kind at hidden
size 64, for tests. Weights are normal, mean 0 (norm weights 1), from one torch generator seeded
with `--seed`, drawn tensor by tensor in the file's order, so greedy outputs are a function of the
seed; speed does not depend on the values. The standard deviation is Llama's 0.02 at hidden size
2048; `tiny` keeps the same gain per projection (std x sqrt(fan-in), about 0.9) with 0.02 x
sqrt(2048 / 64): at 0.02 its layers add almost nothing to the embedding, and its greedy tokens
only repeat the prompt's last one (the 1B's depend on the whole context: logits of standard
deviation 0.9, top-two gaps of 0.02-0.4).

The tokenizer is the built-in model's (SmolLM2, 49,152 tokens: batchgen's workloads are token ids
of it), padded with special tokens `<|reserved_special_token_K|>` to the model's 128,256 ids, so
every id the model can emit decodes in both engines (vLLM detokenizes each output); the reserved
tokens never occur in text, so prompts encode as with SmolLM2. BOS and EOS are SmolLM2's (1 and
2; vllm_driver.py stops at 2).

Memory: model.safetensors is written by hand (8-byte header length, JSON header, raw
little-endian float32), one tensor in memory at a time (the largest, the embedding, is 1.05 GB),
where safetensors' `save_file` would hold every tensor plus serialized copies. Everything goes to
a sibling `OUT_DIR.tmp`, renamed when complete, so a half-written folder is never taken for one.

Imports torch, tokenizers and batchgen's tokenizer (the built-in GGUF's metadata only).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken
from tokenizers import Tokenizer as _Backend

from batchgen.tokenizer.tokenizer import Tokenizer

__all__ = [
    "SHAPES",
    "VOCAB_SIZE",
    "Shape",
    "builtin_tokenizer",
    "hf_config",
    "num_parameters",
    "padded_tokenizer",
    "weight_shapes",
    "write_random_model",
    "write_safetensors",
]

VOCAB_SIZE = 128256  # Llama 3's
_RESERVED = "<|reserved_special_token_{}|>"
_FILES = frozenset({
    "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
})  # fmt: skip
_LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True, slots=True)
class Shape:
    """The widths that set a model's size; the rest of the config is Llama 3.2's."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    weight_std: float  # of every weight but the norms'


SHAPES: dict[str, Shape] = {
    "llama-3.2-1b": Shape(hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8,
                          head_dim=64, weight_std=0.02),
    "tiny": Shape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  weight_std=0.02 * math.sqrt(2048 / 64)),
}  # fmt: skip


def hf_config(shape: str, *, bos_token_id: int, eos_token_id: int) -> dict[str, Any]:
    """config.json of shape `shape` (a key of SHAPES; KeyError otherwise)."""
    s = SHAPES[shape]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": dict(_LLAMA3_ROPE_SCALING),
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
        # Llama-3.2-1B's; without one, transformers 5 warns that the tokenizer may be a Mistral's
        # with a broken regex (vLLM's transformers loads it too)
        "transformers_version": "4.45.0",
    }


def weight_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of model.safetensors, in file order (tied embeddings: no lm_head)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_width = config["num_attention_heads"] * config["head_dim"]
    kv_width = config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden)
    }
    for idx in range(config["num_hidden_layers"]):
        p = f"model.layers.{idx}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q_width, hidden),
            p + "self_attn.k_proj.weight": (kv_width, hidden),
            p + "self_attn.v_proj.weight": (kv_width, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_width),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        })  # fmt: skip
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def num_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of `config`'s model (the tied embedding counted once)."""
    return sum(math.prod(shape) for shape in weight_shapes(config).values())


def write_safetensors(
    path: Path, shapes: Mapping[str, tuple[int, ...]], *, seed: int, std: float
) -> None:
    """Write float32 tensors of `shapes` to `path`: names ending in `norm.weight` all ones, the
    others N(0, std) drawn in `shapes`' order from one generator seeded with `seed`. Holds one
    tensor in memory at a time."""
    if sys.byteorder != "little":
        raise RuntimeError(
            "safetensors stores little-endian values; this writer copies memory as is"
        )
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        end = offset + 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # as safetensors pads it: the data starts 8-aligned
    generator = torch.Generator().manual_seed(seed)
    with path.open("wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for name, shape in shapes.items():
            if name.endswith("norm.weight"):
                tensor = torch.ones(shape, dtype=torch.float32)
            else:
                tensor = torch.empty(shape, dtype=torch.float32).normal_(
                    0.0, std, generator=generator
                )
            f.write(tensor.numpy().data.cast("B"))
            del tensor


def builtin_tokenizer() -> Tokenizer:
    """The built-in model's tokenizer, read from its GGUF's metadata (no weights loaded)."""
    import gguf

    from batchgen.models.checkpoint import default_model_path

    return Tokenizer.from_gguf(gguf.GGUFReader(default_model_path()))


def padded_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> Tokenizer:
    """`tokenizer` with special tokens `<|reserved_special_token_K|>` (K from 0) added at ids
    `tokenizer.vocab_size` .. `vocab_size - 1`; same ids for any text without them. Raises
    ValueError when `tokenizer` already has more than `vocab_size` ids or one of the names."""
    first = tokenizer.vocab_size
    if first > vocab_size:
        raise ValueError(f"the tokenizer has {first} ids, more than vocab_size={vocab_size}")
    backend = _Backend.from_str(tokenizer.backend.to_str())
    names = [_RESERVED.format(k) for k in range(vocab_size - first)]
    backend.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in names])
    if backend.get_vocab_size(with_added_tokens=True) != vocab_size or (
        names and backend.token_to_id(names[-1]) != vocab_size - 1
    ):
        raise ValueError(f"the tokenizer already has a token named like {_RESERVED.format('K')}")
    return Tokenizer(
        backend,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        chat_template=tokenizer.chat_template,
    )


def write_random_model(
    out: Path, shape: str, *, seed: int = 0, tokenizer: Tokenizer | None = None
) -> Path:
    """Write the folder (module docstring) to `out`, replacing one this function wrote there;
    returns `out`. `tokenizer`: the unpadded tokenizer (default: `builtin_tokenizer()`). Raises
    ValueError for an unknown shape or an `out` holding other files."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    out = Path(out)
    others = sorted(p.name for p in out.iterdir() if p.name not in _FILES) if out.is_dir() else []
    if out.exists() and (others or not out.is_dir()):
        raise ValueError(
            f"{out} holds other files ({', '.join(others) or out.name}); not replacing it"
        )
    base = tokenizer if tokenizer is not None else builtin_tokenizer()
    if base.bos_token_id is None or base.eos_token_id is None:
        raise ValueError("the tokenizer needs BOS and EOS tokens")
    config = hf_config(shape, bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    padded_tokenizer(base, VOCAB_SIZE).save_pretrained(tmp)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (tmp / "generation_config.json").write_text(json.dumps(generation) + "\n")
    write_safetensors(
        tmp / "model.safetensors", weight_shapes(config), seed=seed, std=SHAPES[shape].weight_std
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = hf_config(args.shape, bos_token_id=0, eos_token_id=0)
    size_gb = 4 * num_parameters(config) / 1e9
    print(
        f"writing {args.out_dir}: {args.shape}, {num_parameters(config):,} parameters, {size_gb:.2f} GB",
        flush=True,
    )
    write_random_model(args.out_dir, args.shape, seed=args.seed)
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
