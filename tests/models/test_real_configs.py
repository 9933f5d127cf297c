"""`read_hf_config` on the config.json files of public checkpoints, as published.

The fixtures in `real_configs/` are those files verbatim (long arrays included), one per Hugging
Face repository:

| fixture | repository |
| --- | --- |
| gemma-2-2b-it.json | google/gemma-2-2b-it |
| gemma-3-1b-it.json | google/gemma-3-1b-it |
| llama-3.1-8b-instruct.json | meta-llama/Llama-3.1-8B-Instruct |
| mistral-7b-instruct-v0.3.json | mistralai/Mistral-7B-Instruct-v0.3 |
| mixtral-8x7b-v0.1.json | mistralai/Mixtral-8x7B-v0.1 |
| phi-3-mini-4k-instruct.json | microsoft/Phi-3-mini-4k-instruct |
| phi-4-mini-instruct.json | microsoft/Phi-4-mini-instruct |
| qwen2.5-3b.json | Qwen/Qwen2.5-3B |
| qwen2.5-7b-instruct.json | Qwen/Qwen2.5-7B-Instruct |
| qwen3-30b-a3b.json | Qwen/Qwen3-30B-A3B |
| qwen3-8b.json | Qwen/Qwen3-8B |
| smollm2-135m.json | HuggingFaceTB/SmolLM2-135M |
| smollm2-1.7b-instruct.json | HuggingFaceTB/SmolLM2-1.7B-Instruct |

Each must load, and the facts below must come out of it, so a misread key fails here. A flag
batchgen does not implement is still refused at a non-neutral value, and so is an unknown key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchgen.models.config import ModelConfig
from batchgen.models.hf_config import read_hf_config

CONFIGS = Path(__file__).parent / "real_configs"

# Per fixture: ModelConfig fields, plus "rope_type" (None: no scaling) and "rope_factor".
EXPECTED: dict[str, dict[str, Any]] = {
    "gemma-2-2b-it.json": {
        "architecture": "gemma2", "num_layers": 26, "num_heads": 8, "num_kv_heads": 4,
        "head_dim": 256, "vocab_size": 256000, "tie_word_embeddings": True, "rope_type": None,
        "sliding_window": 4096, "layer_types": ("sliding_attention", "full_attention") * 13,
        "attn_logit_softcap": 50.0, "final_logit_softcap": 30.0, "query_pre_attn_scalar": 256.0,
        "hidden_act": "gelu_pytorch_tanh", "eos_token_ids": (1, 107), "bos_token_id": 2,
    },
    "gemma-3-1b-it.json": {
        "architecture": "gemma3_text", "num_layers": 26, "num_heads": 4, "num_kv_heads": 1,
        "head_dim": 256, "vocab_size": 262144, "tie_word_embeddings": True, "rope_type": None,
        "rope_theta": 1e6, "rope_local_theta": 10000.0, "sliding_window": 512,
        "layer_types": tuple(
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)
        ),
        "attn_logit_softcap": None, "final_logit_softcap": None, "qk_norm": True,
        "eos_token_ids": (1, 106),
    },
    "llama-3.1-8b-instruct.json": {
        "architecture": "llama", "num_layers": 32, "num_heads": 32, "num_kv_heads": 8,
        "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": False, "rope_type": "llama3",
        "rope_factor": 8.0, "rope_theta": 500000.0, "sliding_window": None,
        "max_position_embeddings": 131072, "eos_token_ids": (128001, 128008, 128009),
    },
    "mistral-7b-instruct-v0.3.json": {
        "architecture": "mistral", "num_layers": 32, "num_heads": 32, "num_kv_heads": 8,
        "head_dim": 128, "vocab_size": 32768, "tie_word_embeddings": False, "rope_type": None,
        "rope_theta": 1e6, "sliding_window": None,
    },
    "mixtral-8x7b-v0.1.json": {
        "architecture": "mixtral", "num_layers": 32, "num_heads": 32, "num_kv_heads": 8,
        "head_dim": 128, "vocab_size": 32000, "tie_word_embeddings": False, "rope_type": None,
        "sliding_window": None, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 14336,
    },
    "phi-3-mini-4k-instruct.json": {
        "architecture": "phi3", "num_layers": 32, "num_heads": 32, "num_kv_heads": 32,
        "head_dim": 96, "vocab_size": 32064, "tie_word_embeddings": False, "rope_type": None,
        "sliding_window": 2047, "eos_token_ids": (32000,),
    },
    "phi-4-mini-instruct.json": {
        "architecture": "phi3", "num_layers": 32, "num_heads": 24, "num_kv_heads": 8,
        "head_dim": 128, "vocab_size": 200064, "tie_word_embeddings": True, "rope_type": "longrope",
        # No factor in the file: transformers takes max_position_embeddings / original (131072 / 4096).
        "rope_factor": 32.0, "partial_rotary_factor": 0.75, "sliding_window": 262144,
    },
    "qwen2.5-3b.json": {
        "architecture": "qwen2", "num_layers": 36, "num_heads": 16, "num_kv_heads": 2,
        "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True, "rope_type": None,
        "sliding_window": None, "qkv_bias": True,
    },
    "qwen2.5-7b-instruct.json": {
        "architecture": "qwen2", "num_layers": 28, "num_heads": 28, "num_kv_heads": 4,
        "head_dim": 128, "vocab_size": 152064, "tie_word_embeddings": False, "rope_type": None,
        "sliding_window": None, "layer_types": (), "qkv_bias": True, "eos_token_ids": (151645,),
    },
    "qwen3-30b-a3b.json": {
        "architecture": "qwen3_moe", "num_layers": 48, "num_heads": 32, "num_kv_heads": 4,
        "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False, "rope_type": None,
        "sliding_window": None, "num_experts": 128, "num_experts_per_tok": 8,
        "moe_intermediate_size": 768, "norm_topk_prob": True, "dense_layers": (), "qk_norm": True,
    },
    "qwen3-8b.json": {
        "architecture": "qwen3", "num_layers": 36, "num_heads": 32, "num_kv_heads": 8,
        "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False, "rope_type": None,
        "sliding_window": None, "qk_norm": True, "qkv_bias": False,
    },
    "smollm2-135m.json": {
        "architecture": "llama", "num_layers": 30, "num_heads": 9, "num_kv_heads": 3,
        "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True, "rope_type": None,
        "rope_theta": 100000.0, "max_position_embeddings": 8192, "eos_token_ids": (0,),
    },
    "smollm2-1.7b-instruct.json": {
        "architecture": "llama", "num_layers": 24, "num_heads": 32, "num_kv_heads": 32,
        "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True, "rope_type": None,
        "rope_theta": 130000.0, "bos_token_id": 1, "eos_token_ids": (2,),
    },
}  # fmt: skip


def _raw(name: str) -> dict[str, Any]:
    data = json.loads((CONFIGS / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _read(d: dict[str, Any], name: str) -> ModelConfig:
    return read_hf_config(d, source=f"{name}/config.json")


def test_every_fixture_has_expectations() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_config_reads(name: str) -> None:
    config = _read(_raw(name), name)
    expected = dict(EXPECTED[name])
    rope_type = expected.pop("rope_type")
    rope_factor = expected.pop("rope_factor", None)
    assert {key: getattr(config, key) for key in expected} == expected
    if rope_type is None:
        assert config.rope_scaling is None
    else:
        assert config.rope_scaling is not None
        assert config.rope_scaling.rope_type == rope_type
        assert config.rope_scaling.factor == rope_factor


def test_llama3_and_longrope_parameters() -> None:
    llama = _read(_raw("llama-3.1-8b-instruct.json"), "llama")
    assert llama.rope_scaling is not None
    assert (llama.rope_scaling.low_freq_factor, llama.rope_scaling.high_freq_factor) == (1.0, 4.0)
    assert llama.rope_scaling.original_max_position_embeddings == 8192

    raw = _raw("phi-4-mini-instruct.json")
    phi = _read(raw, "phi4")
    scaling = phi.rope_scaling
    assert scaling is not None and scaling.original_max_position_embeddings == 4096
    # One factor per rotated pair: 0.75 of head_dim 128 is 96 dimensions, 48 pairs.
    assert len(scaling.short_factor) == len(scaling.long_factor) == 48
    assert scaling.long_factor == tuple(float(x) for x in raw["rope_scaling"]["long_factor"])
    assert scaling.long_factor[-1] == 47.77


def test_qwen3_moe_keeps_every_layer_sparse() -> None:
    config = _read(_raw("qwen3-30b-a3b.json"), "qwen3moe")
    assert config.dense_layers == ()
    assert config.intermediate_size == 6144


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_unknown_key_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"\['foo_new_feature'\] are not implemented"):
        _read({**_raw(name), "foo_new_feature": 1}, name)


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("smollm2-135m.json", "rope_interleaved", True),
        ("smollm2-1.7b-instruct.json", "mlp_bias", True),
        ("qwen2.5-3b.json", "use_mrope", True),
        ("phi-4-mini-instruct.json", "lm_head_bias", True),
        ("gemma-2-2b-it.json", "sliding_window_size", 2048),
        ("gemma-3-1b-it.json", "use_bidirectional_attention", True),
    ],
)
def test_unimplemented_flag_is_refused_off_its_neutral_value(
    name: str, key: str, value: Any
) -> None:
    with pytest.raises(ValueError, match=rf"{key}={value!r} is not supported"):
        _read({**_raw(name), key: value}, name)


def test_gemma2_window_repeated_as_sliding_window_size() -> None:
    # gemma-2-9b-it and gemma-2-27b-it's config.json carry "sliding_window_size": 4096 besides
    # "sliding_window": 4096; transformers reads only the latter.
    config = _read({**_raw("gemma-2-2b-it.json"), "sliding_window_size": 4096}, "gemma2")
    assert config.sliding_window == 4096
