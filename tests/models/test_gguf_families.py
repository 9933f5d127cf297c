"""GGUF files of every architecture batchgen runs load and give the Hugging Face folder's greedy
tokens (issue 23).

Each case builds a random tiny Hugging Face folder with transformers, converts it to GGUF the way
llama.cpp's converter does for that architecture (`tests/gguf_writer.py`: llama.cpp's metadata
keys and tensor names, Q/K permuted for llama and smollm3, Gemma's w + 1 norms, stacked experts,
Phi-3's fused tensors and LongRoPE factor tensors), and checks that batchgen reads the file into
the folder's config and weights, and that the engine gives the same greedy tokens and
log-probabilities from both. The configs exercise what each architecture's file carries or
leaves to llama.cpp's defaults: q/k norms (Qwen3, Gemma 3), 8 experts top-2
(Qwen3-MoE), Mixtral's experts under the llama architecture, Gemma 2's soft caps and a window
of 8 under prompts of 12 and 20 tokens, Gemma 3's five-of-six sliding layers with local and
global rope bases and linear scaling, Phi-3's partial rotary with LongRoPE (long factors in
use) and a window, SmolLM3's layer without rope, Qwen2's biases, and a Mistral folder, which
llama.cpp stores as llama. One case stores its matrices as Q8_0 and is compared with the
folder holding the dequantized values.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from batchgen import LLM, SamplingParams
from batchgen.models.checkpoint import Checkpoint, load_checkpoint
from batchgen.models.gguf_config import GGUF_ARCHITECTURES
from tests.gguf_writer import make_small_vocab_folder, q8_0_round_trip, write_gguf
from tests.tiny_models import finish_gguf

WINDOW = 8
PROMPTS = [[5, 17, 42, 99, 150], [7 + 3 * i for i in range(12)], [300 - 11 * i for i in range(20)]]
NEW_TOKENS = 8
ENGINE = {"num_kv_blocks": 64, "max_model_len": 128, "max_num_batched_tokens": 64}

_LONG = [1.0, 1.25, 2.5, 4.0, 6.5, 9.0]
_SHORT = [1.0, 1.0, 1.125, 1.5, 2.0, 2.75]

CASES: dict[str, dict[str, Any]] = {
    "qwen3": {"architecture": "qwen3", "tie_word_embeddings": False},
    "qwen3_moe-8x2": {
        "architecture": "qwen3_moe",
        "extra_config": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True},
    },
    "mixtral-8x2": {
        "architecture": "mixtral", "tie_word_embeddings": False, "intermediate_size": 64,
        "extra_config": {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None},
    },
    # Soft caps unlike llama.cpp's defaults (50, 30), so reading them is checked; layers 0 and 2 slide.
    "gemma2-window-softcap": {
        "architecture": "gemma2", "num_layers": 3,
        "extra_config": {
            "sliding_window": WINDOW, "query_pre_attn_scalar": 16,
            "attn_logit_softcapping": 20.0, "final_logit_softcapping": 15.0,
        },
    },
    # Layers 0-4 slide with base 1e4, layer 5 is global with base 1e6 and linear scaling.
    "gemma3-local-global-rope": {
        "architecture": "gemma3_text", "num_layers": 6, "tie_word_embeddings": False,
        "extra_config": {
            "sliding_window": WINDOW, "query_pre_attn_scalar": 16,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        },
    },
    # Phi-4-mini's partial rotary (0.75 of head_dim 16); the original context (64) is below the
    # engine's max_model_len (128), so the long factors are the ones in use.
    "phi3-partial-longrope-window": {
        "architecture": "phi3", "head_dim": None, "tie_word_embeddings": False,
        "extra_config": {
            "sliding_window": 10, "original_max_position_embeddings": 64,
            "rope_parameters": {
                "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "original_max_position_embeddings": 64, "long_factor": _LONG, "short_factor": _SHORT,
            },
        },
    },
    "smollm3-nope": {"architecture": "smollm3", "num_layers": 4},
    "qwen2-bias": {"architecture": "qwen2"},
    "mistral": {"architecture": "mistral", "extra_config": {"sliding_window": None}},
}  # fmt: skip

# What the GGUF of a case legitimately says otherwise: llama.cpp writes Mistral as llama.
_GGUF_DIFFERS = {"mistral": {"architecture": "llama"}}


def _greedy(model: Path) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1)
    runs = []
    for out in LLM(str(model), seed=0, **ENGINE).generate(PROMPTS, params, use_tqdm=False):
        sample = out.outputs[0]
        assert sample.logprobs is not None and len(sample.token_ids) == NEW_TOKENS
        tokens = list(sample.token_ids)
        runs.append((tokens, [entry[t] for t, entry in zip(tokens, sample.logprobs, strict=True)]))
    return runs


def _assert_same_model(
    from_gguf: Checkpoint, from_folder: Checkpoint, differs: dict[str, Any]
) -> None:
    assert from_gguf.config == dataclasses.replace(from_folder.config, **differs)
    assert from_gguf.weights.keys() == from_folder.weights.keys()
    for name, tensor in from_folder.weights.items():
        # Gemma's norms come back as (w + 1) - 1 in float32: equal to w within 1 ulp of 1.
        torch.testing.assert_close(from_gguf.weights[name], tensor, rtol=0, atol=2e-7, msg=name)


def _assert_same_generation(gguf_path: Path, folder: Path) -> None:
    ours, reference = _greedy(gguf_path), _greedy(folder)
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(ours, reference, strict=True):
        assert tokens == ref_tokens
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-5)
    # The runs differ between prompts: the model is not stuck on one token.
    assert len({tuple(tokens) for tokens, _ in reference}) > 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_gguf_gives_the_folder_s_greedy_tokens(tmp_path: Path, case: str) -> None:
    folder = make_small_vocab_folder(tmp_path, **CASES[case])
    path = write_gguf(folder, tmp_path / f"{case}.gguf")
    from_gguf, from_folder = load_checkpoint(path), load_checkpoint(folder)
    _assert_same_model(from_gguf, from_folder, _GGUF_DIFFERS.get(case, {}))
    text = "The lazy fox writes 42 GGUF files!"
    assert from_gguf.tokenizer.encode(text) == from_folder.tokenizer.encode(text)
    _assert_same_generation(path, folder)


def test_q8_0_gguf_gives_the_dequantized_folder_s_tokens(tmp_path: Path) -> None:
    """Matrices (experts included) stored as Q8_0, norms as F32, as `--outtype q8_0` does."""
    folder = make_small_vocab_folder(tmp_path, **CASES["mixtral-8x2"])
    dequantized = q8_0_round_trip(folder, tmp_path / "q8_0-folder")
    path = write_gguf(dequantized, tmp_path / "mixtral-q8_0.gguf", quantize=True)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    from_gguf, from_folder = load_checkpoint(path), load_checkpoint(dequantized)
    _assert_same_model(from_gguf, from_folder, {})
    original = load_checkpoint(folder).weights["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(from_gguf.weights["model.layers.0.self_attn.q_proj.weight"], original)
    _assert_same_generation(path, dequantized)


# ---------------------------------------------------------------- errors name the file and key

_QWEN3_METADATA: dict[str, Any] = {
    "block_count": 1, "context_length": 64, "embedding_length": 64, "feed_forward_length": 96,
    "attention.head_count": 4, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-6,
    "vocab_size": 384,
}  # fmt: skip


def _metadata_file(path: Path, arch: str, values: dict[str, Any]) -> Path:
    """A GGUF holding `{arch}.*` metadata only (no tensors, no tokenizer)."""
    writer = gguf.GGUFWriter(path, arch)
    for key, value in values.items():
        if isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    finish_gguf(writer)
    return path


def test_unsupported_architecture_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    path = _metadata_file(tmp_path / "other.gguf", "gpt2", {"block_count": 1})
    supported = ", ".join(GGUF_ARCHITECTURES)
    assert supported == "llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, smollm3"
    with pytest.raises(
        ValueError,
        match=rf"other\.gguf: general\.architecture 'gpt2' is not supported for GGUF; supported: {supported}$",
    ):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "key", ["attention.layer_norm_rms_epsilon", "context_length", "block_count"]
)
def test_missing_required_key_is_named(tmp_path: Path, key: str) -> None:
    values = {k: v for k, v in _QWEN3_METADATA.items() if k != key}
    path = _metadata_file(tmp_path / "partial.gguf", "qwen3", values)
    with pytest.raises(ValueError, match=rf"partial\.gguf: missing metadata key qwen3\.{key}$"):
        load_checkpoint(path)


def test_missing_expert_size_is_named(tmp_path: Path) -> None:
    values = {**_QWEN3_METADATA, "expert_count": 8, "expert_used_count": 2}
    path = _metadata_file(tmp_path / "moe.gguf", "qwen3moe", values)
    with pytest.raises(
        ValueError, match=r"moe\.gguf: missing metadata key qwen3moe\.expert_feed_forward_length$"
    ):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        # llama.cpp's qwen3 has no sliding window: batchgen does not guess one.
        ({"attention.sliding_window": 8}, r"qwen3\.attention\.sliding_window = 8 is set, but"),
        ({"final_logit_softcapping": 30.0}, r"qwen3\.final_logit_softcapping = 30\.0 is set, but"),
        ({"expert_gating_func": 2}, r"qwen3\.expert_gating_func = 2 is not supported"),
        (
            {"attention.value_length": 32},
            r"qwen3\.attention\.value_length 32 differs from key_length 16",
        ),
    ],
    ids=["window", "softcap", "sigmoid-gating", "value-length"],
)
def test_feature_batchgen_does_not_implement_is_refused(
    tmp_path: Path, extra: dict[str, Any], match: str
) -> None:
    path = _metadata_file(tmp_path / "feature.gguf", "qwen3", {**_QWEN3_METADATA, **extra})
    with pytest.raises(ValueError, match=rf"feature\.gguf: {match}"):
        load_checkpoint(path)


def test_phi3_longrope_without_its_factors_is_refused(tmp_path: Path) -> None:
    values = {**_QWEN3_METADATA, "rope.scaling.original_context_length": 32}
    writer_path = tmp_path / "phi3.gguf"
    writer = gguf.GGUFWriter(writer_path, "phi3")
    for key, value in values.items():
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(
            f"phi3.{key}", value
        )
    writer.add_tensor("rope_factors_long.weight", np.ones(8, dtype=np.float32))
    finish_gguf(writer)
    with pytest.raises(
        ValueError,
        match=r"phi3\.gguf: longrope needs tensor rope_factors_short\.weight of \(8,\), found missing",
    ):
        load_checkpoint(writer_path)
