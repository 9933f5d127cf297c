"""Prompt log-probabilities and scores equal transformers' log_softmax (float32, within 1e-4) on
every prompt token: with chunked prefills, for a prompt partly in the prefix cache (such a
request computes its prompt), across preemption, and `LLM.score` equals the sum over the
completion's tokens (the prompt's KV shared through the cache)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from batchgen import LLM, SamplingParams
from batchgen.engine.outputs import RequestOutput
from tests.tiny_models import make_tiny_hf_folder

TOL = 1e-4


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


@pytest.fixture(scope="module")
def hf_model(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def reference(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """log_softmax of every position's logits: row i - 1 gives token i's log-probability."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def check_entries(out: RequestOutput, ref: torch.Tensor, start: int, k: int) -> None:
    entries = out.prompt_logprobs
    ids = list(out.prompt_token_ids)
    assert entries is not None and len(entries) == len(ids)
    assert all(e is None for e in entries[:start])
    for i in range(start, len(ids)):
        entry = entries[i]
        assert entry is not None, i
        assert abs(entry[ids[i]] - float(ref[i - 1, ids[i]])) < TOL, i
        top = torch.topk(ref[i - 1], k)
        assert set(entry) == set(top.indices.tolist()) | {ids[i]}, i
        for token, value in zip(top.indices.tolist(), top.values.tolist(), strict=True):
            assert abs(entry[token] - value) < TOL


def random_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def test_prompt_logprobs_over_chunked_prefills(folder: Path, hf_model: torch.nn.Module) -> None:
    rng = random.Random(0)
    prompts = [random_prompt(rng, n) for n in (1, 2, 17, 40, 63)]
    llm = LLM(str(folder), block_size=4, max_num_batched_tokens=16, seed=0)
    params = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out in outs:
        check_entries(out, reference(hf_model, list(out.prompt_token_ids)), 1, 3)
        assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    plain = llm.generate(prompts, params.replace(prompt_logprobs=None), use_tqdm=False)
    assert all(p.prompt_logprobs is None for p in plain)
    assert [o.outputs[0].token_ids for o in outs] == [p.outputs[0].token_ids for p in plain]


def test_a_prompt_partly_in_the_cache_is_computed(folder: Path, hf_model: torch.nn.Module) -> None:
    rng = random.Random(1)
    shared = random_prompt(rng, 24)
    prompt = shared + random_prompt(rng, 9)
    llm = LLM(str(folder), block_size=4, max_num_batched_tokens=32, seed=0)
    params = SamplingParams(temperature=0, max_tokens=2)
    llm.generate([[*shared, 7, 7]], params, use_tqdm=False)  # fills the cache with `shared`
    warm = llm.generate([prompt], params, use_tqdm=False)[0]
    assert warm.num_cached_tokens == 24  # the cache holds the prefix ...
    out = llm.generate([prompt], params.replace(prompt_logprobs=0), use_tqdm=False)[0]
    assert out.num_cached_tokens == 0  # ... but a prompt-logprobs request computes it
    check_entries(out, reference(hf_model, prompt), 1, 0)


def test_score_from_takes_the_prefix_from_the_cache(folder: Path, hf_model: torch.nn.Module) -> None:
    rng = random.Random(2)
    prefix = random_prompt(rng, 21)
    prompt = prefix + random_prompt(rng, 11)
    llm = LLM(str(folder), block_size=4, max_num_batched_tokens=64, seed=0)
    params = SamplingParams(temperature=0, max_tokens=1)
    llm.generate([[*prefix, 5]], params, use_tqdm=False)
    engine = llm.engine
    engine.add_request(prompt, params, score_from=len(prefix))
    (out,) = [o for _ in range(10) for o in engine.step()][:1]
    assert out.num_cached_tokens == 20  # full blocks before position 21 - 1
    check_entries(out, reference(hf_model, prompt), len(prefix), 0)
    with pytest.raises(ValueError, match=r"score_from=0 must be in \[1, 32\]"):
        engine.add_request(prompt, params, score_from=0)


def test_prompt_logprobs_across_preemption(folder: Path, hf_model: torch.nn.Module) -> None:
    rng = random.Random(3)
    prompts = [random_prompt(rng, n) for n in (30, 25, 33, 20)]
    llm = LLM(str(folder), block_size=4, num_kv_blocks=14, max_model_len=48, max_num_batched_tokens=12,
              admission_reserve_tokens=0, seed=0)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=2, n=2)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["num_preemptions"] >= 2
    for out in outs:
        check_entries(out, reference(hf_model, list(out.prompt_token_ids)), 1, 2)


def test_score_equals_the_sum_of_the_completion_logprobs(folder: Path, hf_model: torch.nn.Module) -> None:
    llm = LLM(str(folder), block_size=4, max_num_batched_tokens=32, seed=0)
    tok = llm.tokenizer
    prompt = "The capital of France is a city that many people like to visit in"
    completions = [" Paris.", " the spring, when it is warm", " winter"]
    scores = llm.score(prompt, completions, use_tqdm=False)
    prompt_ids = tok.encode(prompt)
    assert [s.prompt_token_ids for s in scores] == [tuple(prompt_ids)] * 3
    for completion, score in zip(completions, scores, strict=True):
        completion_ids = tok.encode(completion, add_special_tokens=False)
        assert score.completion_token_ids == tuple(completion_ids)
        ids = prompt_ids + completion_ids
        ref = reference(hf_model, ids)
        expected = [float(ref[i - 1, ids[i]]) for i in range(len(prompt_ids), len(ids))]
        assert score.num_tokens == len(completion_ids)
        assert all(abs(a - b) < TOL for a, b in zip(score.token_logprobs, expected, strict=True))
        assert abs(score.logprob_sum - math.fsum(expected)) < TOL * len(expected)
        assert score.logprob_sum == math.fsum(score.token_logprobs)
        assert score.perplexity == math.exp(-score.logprob_sum / score.num_tokens)
    # The later pairs took the prompt's full blocks from the cache (prompt - 1 tokens at most).
    assert scores[0].num_cached_tokens == 0
    assert scores[2].num_cached_tokens == (len(prompt_ids) - 1) // 4 * 4 > 0
    with pytest.raises(ValueError, match="completion 1 is empty"):
        llm.score(["a", "b"], ["x", ""], use_tqdm=False)
    with pytest.raises(ValueError, match="got 2 prompts for 3 completions"):
        llm.score(["a", "b"], ["x", "y", "z"], use_tqdm=False)
    by_ids = llm.score([prompt_ids], [tok.encode(" Paris.", add_special_tokens=False)], use_tqdm=False)
    # (cached or not, the same values up to float noise)
    assert by_ids[0].token_logprobs == pytest.approx(scores[0].token_logprobs, abs=TOL)
