"""Greedy outputs equal Hugging Face transformers' on the same weights, token for token.

Where float noise flips a near-tie, the two top log-probabilities at the first divergence must
differ by less than 1e-3 (measured by the reference on the common prefix).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from batchgen import LLM, SamplingParams
from tests.tiny_models import make_tiny_hf_folder

NEW_TOKENS = 32


def hf_greedy(model: torch.nn.Module, prompt: list[int], num_new: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy continuation without cache (plain full forward each step) and each step's logprobs."""
    ids = list(prompt)
    step_logprobs = []
    with torch.no_grad():
        for _ in range(num_new):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            step_logprobs.append(logprobs)
            ids.append(int(torch.argmax(logprobs)))
    return ids[len(prompt) :], step_logprobs


def assert_parity(ours: list[int], ref: list[int], ref_logprobs: list[torch.Tensor]) -> None:
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        if a != b:
            top2 = torch.topk(ref_logprobs[i], 2)
            gap = float(top2.values[0] - top2.values[1])
            assert gap < 1e-3, f"token {i}: ours {a}, reference {b}, reference top-2 gap {gap:.2e}"
            assert a in top2.indices.tolist()
            return


def random_prompts(seed: int, vocab: int, count: int = 8) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 3, 7, 16, 17, 29, 40, 55][:count]
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


CASES = [
    # architecture, heads, kv heads, head_dim, tied
    pytest.param("llama", 4, 4, 32, True, id="llama-mha-d32-tied"),
    pytest.param("llama", 4, 2, 32, False, id="llama-gqa2-d32-untied"),
    pytest.param("llama", 6, 2, 64, True, id="llama-gqa3-d64-tied"),
    pytest.param("llama", 8, 1, 64, False, id="llama-mqa-d64-untied"),
    pytest.param("qwen2", 4, 2, 32, True, id="qwen2-gqa2-d32-tied"),
    pytest.param("qwen2", 6, 3, 64, False, id="qwen2-gqa2-d64-untied"),
]


@pytest.mark.parametrize(("architecture", "num_heads", "num_kv_heads", "head_dim", "tied"), CASES)
def test_greedy_matches_transformers(
    tmp_path: Path, architecture: str, num_heads: int, num_kv_heads: int, head_dim: int, tied: bool
) -> None:
    from transformers import AutoModelForCausalLM

    folder = make_tiny_hf_folder(
        tmp_path,
        architecture=architecture,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        hidden_size=num_heads * head_dim,
        tie_word_embeddings=tied,
    )
    ref_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    llm = LLM(str(folder), block_size=16, max_num_batched_tokens=64, seed=0)
    prompts = random_prompts(1, llm.engine.model_config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [list(o.prompt_token_ids) for o in outputs] == prompts
    for prompt, out in zip(prompts, outputs, strict=True):
        ours = list(out.outputs[0].token_ids)
        assert len(ours) == NEW_TOKENS and out.outputs[0].finish_reason == "length"
        ref, ref_logprobs = hf_greedy(ref_model, prompt, NEW_TOKENS)
        assert_parity(ours, ref, ref_logprobs)
