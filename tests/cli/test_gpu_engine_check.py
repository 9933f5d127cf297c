"""The engine-level GPU check's comparison, run on CPU: the logic on crafted outputs, and the
whole check on a tiny model (PyTorch attention against itself, and bfloat16 against float32)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from batchgen import LLM, SamplingParams
from batchgen.cli.gpu_engine_check import Candidate, compare_greedy, run_engine_check, top2_gap
from tests.tiny_models import make_tiny_hf_folder

BF16_MAX_GAP = 0.5  # logits (nats): gpu_check.ENGINE_CANDIDATES' bfloat16 gap


def no_gap(prompt_idx: int, position: int) -> float:
    raise AssertionError("the gap is asked only where tokens differ")


def test_identical_outputs_pass_without_asking_for_gaps() -> None:
    result = compare_greedy([[1, 2, 3], [4]], [[1, 2, 3], [4]], no_gap, max_gap=0.1)
    assert result.ok and result.num_identical == 2 and result.divergences == ()


def test_a_difference_passes_only_where_the_reference_nearly_ties() -> None:
    reference, candidate = [[1, 2, 3, 7], [4, 5, 6]], [[1, 2, 9, 9], [4, 5, 6]]
    asked: list[tuple[int, int]] = []

    def gap(value: float) -> Callable[[int, int], float]:
        def reference_gap(prompt_idx: int, position: int) -> float:
            asked.append((prompt_idx, position))
            return value
        return reference_gap

    near_tie = compare_greedy(reference, candidate, gap(0.02), max_gap=0.1)
    assert near_tie.ok and near_tie.num_identical == 1
    (d,) = near_tie.divergences
    assert (d.prompt_idx, d.position, d.reference_token, d.candidate_token) == (0, 2, 3, 9)
    assert asked == [(0, 2)]  # only the first differing position
    clear_winner = compare_greedy(reference, candidate, gap(0.8), max_gap=0.1)
    assert not clear_winner.ok and not clear_winner.divergences[0].is_allowed
    assert clear_winner.as_dict()["ok"] is False


def test_a_shorter_output_is_a_divergence() -> None:
    result = compare_greedy([[1, 2, 3]], [[1, 2]], lambda i, p: 1.0, max_gap=0.1)
    assert not result.ok and result.divergences[0].position == 2
    with pytest.raises(ValueError, match="1 reference outputs but 2 candidate"):
        compare_greedy([[1]], [[1], [2]], no_gap, max_gap=0.1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def test_top2_gap_is_the_logit_gap(folder: Path) -> None:
    llm = LLM(str(folder), seed=0)
    prompt = [1500, 1600, 1700]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=5), use_tqdm=False)
    entry = out[0].outputs[0].logprobs
    assert entry is not None
    values = torch.tensor(sorted(entry[0].values(), reverse=True))
    assert top2_gap(llm, prompt) == pytest.approx(float(values[0] - values[1]), abs=1e-6)
    assert top2_gap(llm, prompt) > 0


def test_whole_check_on_cpu(folder: Path) -> None:
    prompts = ("The capital of France is", "1, 2, 3, 5, 8,")
    same = Candidate("torch-float32", "torch", "float32", max_gap=0.0)
    # The GPU check's bfloat16 gap (gpu_check.ENGINE_CANDIDATES); on this model bfloat16 keeps
    # every greedy token (measured: 8 of 8 check prompts, 16 tokens each).
    bf16 = Candidate("torch-bfloat16", "torch", "bfloat16", max_gap=BF16_MAX_GAP)
    results = run_engine_check(str(folder), device="cpu", candidates=[same, bf16], max_tokens=8, prompts=prompts,
                               kv_cache_memory_bytes=1 << 23)
    assert results["torch-float32"].ok and results["torch-float32"].num_identical == 2
    low = results["torch-bfloat16"]
    assert low.ok and low.num_prompts == 2 and low.max_gap == BF16_MAX_GAP
    assert low.num_identical == 2 and low.divergences == ()


def test_a_wrong_engine_fails_the_bfloat16_gap(tmp_path: Path, folder: Path) -> None:
    """The gap is a real threshold: greedy tokens of other weights (a broken candidate) diverge
    where the reference's top-2 gap exceeds it (measured: 1.19 and 0.51 at the first token)."""
    reference = LLM(str(folder), seed=0)
    other = LLM(str(make_tiny_hf_folder(tmp_path, num_heads=4, num_kv_heads=2, hidden_size=64, seed=1)), seed=0)
    prompts = [reference.tokenizer.encode(p) for p in ("The capital of France is", "1, 2, 3, 5, 8,")]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ref, cand = ([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] for llm in (reference, other))
    result = compare_greedy(ref, cand, lambda i, pos: top2_gap(reference, [*prompts[i], *ref[i][:pos]]), max_gap=BF16_MAX_GAP)
    assert not result.ok and result.num_identical == 0
    assert [d.position for d in result.divergences] == [0, 0]
    assert max(d.reference_gap for d in result.divergences) > BF16_MAX_GAP


def test_the_gap_is_inclusive() -> None:
    at = compare_greedy([[1, 2]], [[1, 3]], lambda i, p: BF16_MAX_GAP, max_gap=BF16_MAX_GAP)
    above = compare_greedy([[1, 2]], [[1, 3]], lambda i, p: BF16_MAX_GAP + 1e-6, max_gap=BF16_MAX_GAP)
    assert at.ok and not above.ok
