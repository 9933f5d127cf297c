"""Every supported architecture against transformers on random tiny models (issue 23).

Each case runs the engine in the four invariance modes of `tests/engine/parity.py` (prefix cache
on and off, an 8-token chunk budget, forced preemption) and checks every greedy token against
transformers' argmax on the same prefix (a near tie, top-2 gap below 1e-3, is allowed and
recorded) and every token's log-probability against transformers' `log_softmax` within 1e-4, in
float32. The configs cover head_dim 128 and 256, GQA groups of 1 to 8, sliding windows of 8 and
10 tokens under prompts of 10 to 41 (windows that cross block boundaries at block sizes 16 and
4), soft caps, q/k norms, partial rotary, layers without rotary embedding, and 8 experts top-2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.parity import check_parity, shared_prefix_prompts
from tests.tiny_models import TINY_VOCAB_SIZE, make_tiny_hf_folder

WINDOW = 8  # shorter than every prompt but one, not a multiple of the block sizes (16, 4)

CASES: dict[str, dict[str, Any]] = {
    # Qwen3: q/k norms; head_dim 128; the window on the second layer only (max_window_layers 1).
    "qwen3-d128-window": {
        "architecture": "qwen3", "head_dim": 128,
        "extra_config": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    },
    "qwen3-d128-gqa8": {"architecture": "qwen3", "head_dim": 128, "num_heads": 8, "num_kv_heads": 1},
    "qwen3_moe-8x2-renormalized": {
        "architecture": "qwen3_moe", "head_dim": 64, "tie_word_embeddings": False,
        "extra_config": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True},
    },
    "qwen3_moe-8x2-plain-dense-layer": {
        "architecture": "qwen3_moe", "head_dim": 32,
        "extra_config": {
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "norm_topk_prob": False,
            "mlp_only_layers": [1],
        },
    },
    "mixtral-8x2-window": {
        "architecture": "mixtral", "head_dim": 32, "tie_word_embeddings": False,
        "extra_config": {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": WINDOW},
    },
    # Gemma 2: head_dim 256, window on layers 0 and 2, soft caps 50 / 30, query_pre_attn_scalar
    # unlike head_dim, embeddings tied (the output projection sees the unscaled matrix).
    "gemma2-d256-window-softcap": {
        "architecture": "gemma2", "head_dim": 256, "num_heads": 2, "num_kv_heads": 1, "num_layers": 3,
        "extra_config": {"sliding_window": WINDOW, "query_pre_attn_scalar": 64},
    },
    # Gemma 3: q/k norms, local base 1e4 on sliding layers, global base 1e6 with linear scaling.
    "gemma3-d256-window-local-rope": {
        "architecture": "gemma3_text", "head_dim": 256, "num_heads": 4, "num_kv_heads": 2, "num_layers": 3,
        "tie_word_embeddings": False,
        "extra_config": {
            "sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        },
    },
    # Phi-4-mini's shape of attention: partial rotary 0.75 of head_dim 32, GQA 2, a window.
    "phi3-partial-rotary-window": {
        "architecture": "phi3", "hidden_size": 128, "num_heads": 4, "num_kv_heads": 2,
        "extra_config": {"partial_rotary_factor": 0.75, "sliding_window": 10},
    },
    # SmolLM3: layer 3 (every fourth) without rotary embedding; head_dim 128.
    "smollm3-nope-d128": {"architecture": "smollm3", "head_dim": 128, "num_layers": 4},
    "mistral-window": {"architecture": "mistral", "head_dim": 32, "extra_config": {"sliding_window": WINDOW}},
    "qwen2-window-bias": {
        "architecture": "qwen2", "head_dim": 32,
        "extra_config": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    },
    "llama-d128-gqa4-attention-bias": {
        "architecture": "llama", "head_dim": 128, "num_heads": 8, "num_kv_heads": 2,
        "extra_config": {"attention_bias": True},
    },
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers_in_every_invariance_mode(tmp_path: Path, case: str) -> None:
    folder = make_tiny_hf_folder(tmp_path, **CASES[case])
    report = check_parity(folder, shared_prefix_prompts(TINY_VOCAB_SIZE))
    assert report.worst_logprob_error < 1e-4
    assert report.num_preemptions > 0
