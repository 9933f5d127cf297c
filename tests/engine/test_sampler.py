"""Sampling semantics through the public `sample` function: the exact tokens top-k (with ties),
top-p and min-p keep, the frequencies of the seeded draw, logprob values, and a zero draw.

A token is "kept" when some seed draws it; with equal kept probabilities and hundreds of seeds
every kept token is drawn (and a dropped one never is)."""

from __future__ import annotations

import math

import pytest
import torch

from batchgen.engine.sampler import SampleRequest, sample
from batchgen.engine.sampling_params import MAX_LOGPROBS, MAX_N, SamplingParams


def drawn(logits: list[float], params: SamplingParams, num_seeds: int = 400) -> list[int]:
    row = torch.tensor([logits], dtype=torch.float32)
    requests = [SampleRequest(row=0, params=params, seed=seed, token_idx=0) for seed in range(num_seeds)]
    return sample(row, requests).token_ids


def probs_logits(probs: list[float]) -> list[float]:
    return [math.log(p) for p in probs]


@pytest.mark.parametrize(
    ("top_k", "kept"),
    [(1, {1}), (2, {1, 2}), (3, {1, 2, 3}), (4, {0, 1, 2, 3}), (5, {0, 1, 2, 3, 4}), (-1, {0, 1, 2, 3, 4})],
)
def test_top_k_keeps_exactly_k_with_ties_to_lower_ids(top_k: int, kept: set[int]) -> None:
    logits = [2.0, 3.0, 3.0, 3.0, 1.0]  # tokens 1, 2, 3 tie for the top
    assert set(drawn(logits, SamplingParams(top_k=top_k))) == kept


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.3, {0}), (0.5, {0}), (0.6, {0, 1}), (0.75, {0, 1}), (0.85, {0, 1, 2}), (0.97, {0, 1, 2, 3}), (1.0, {0, 1, 2, 3})],
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p: float, kept: set[int]) -> None:
    logits = probs_logits([0.5, 0.3, 0.15, 0.05])
    assert set(drawn(logits, SamplingParams(top_p=top_p), num_seeds=1000)) == kept


@pytest.mark.parametrize(("min_p", "kept"), [(0.05, {0, 1, 2, 3}), (0.2, {0, 1, 2}), (0.5, {0, 1}), (0.9, {0})])
def test_min_p_drops_tokens_below_min_p_times_the_top(min_p: float, kept: set[int]) -> None:
    logits = probs_logits([0.5, 0.3, 0.15, 0.05])  # thresholds 0.025, 0.1, 0.25, 0.45
    assert set(drawn(logits, SamplingParams(min_p=min_p), num_seeds=1000)) == kept


def test_filters_combine_top_k_then_top_p() -> None:
    logits = probs_logits([0.4, 0.3, 0.2, 0.1])
    # top_k=3 renormalises to 4/9, 3/9, 2/9; top_p=0.7 then keeps 4/9 + 3/9.
    assert set(drawn(logits, SamplingParams(top_k=3, top_p=0.7), num_seeds=1000)) == {0, 1}


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_draw_frequencies_follow_the_distribution(temperature: float) -> None:
    probs = [0.5, 0.25, 0.15, 0.07, 0.03]
    num = 4000
    tokens = drawn(probs_logits(probs), SamplingParams(temperature=temperature), num_seeds=num)
    tempered = [p ** (1 / temperature) for p in probs]
    expected = [num * p / sum(tempered) for p in tempered]
    counts = [tokens.count(i) for i in range(len(probs))]
    chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected, strict=True))
    assert chi2 < 18.47, (counts, expected)  # chi-square, 4 degrees of freedom, p = 0.001


def test_a_zero_exponential_draw_never_picks_a_filtered_token(monkeypatch: pytest.MonkeyPatch) -> None:
    # E_i = 0 for every token: p/0 is inf for kept tokens and NaN (0/0) for filtered ones.
    def zero_exponential(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return self.zero_()

    monkeypatch.setattr(torch.Tensor, "exponential_", zero_exponential)
    logits = [1.0, 5.0, 0.0, 4.0]
    for params in (SamplingParams(top_k=1), SamplingParams(top_p=0.5), SamplingParams(min_p=0.9)):
        assert set(drawn(logits, params, num_seeds=5)) == {1}


def test_logprobs_are_log_softmax_of_the_logits() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 4
    params = SamplingParams(temperature=0.7, top_k=5, logprobs=4)
    requests = [SampleRequest(row=r, params=params, seed=r, token_idx=2) for r in range(3)]
    greedy = SampleRequest(row=1, params=SamplingParams(temperature=0, logprobs=0), seed=0, token_idx=0)
    result = sample(logits, [*requests, greedy])
    reference = torch.log_softmax(logits.double(), dim=-1)
    for req, token, entry in zip([*requests, greedy], result.token_ids, result.logprobs, strict=True):
        assert entry is not None
        top = torch.topk(reference[req.row], req.params.logprobs or 0).indices.tolist()
        assert set(entry) == {*top, token}
        for t, value in entry.items():
            assert value == pytest.approx(float(reference[req.row, t]), abs=1e-5)
    assert result.token_ids[-1] == int(torch.argmax(logits[1]))


def test_per_request_caps() -> None:
    SamplingParams(n=MAX_N, logprobs=MAX_LOGPROBS)
    with pytest.raises(ValueError, match=r"SamplingParams.n must be an integer in \[1, 128\]"):
        SamplingParams(n=MAX_N + 1)
    with pytest.raises(ValueError, match=r"SamplingParams.logprobs must be an integer in \[0, 20\]"):
        SamplingParams(logprobs=MAX_LOGPROBS + 1)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams.from_mapping({"logprobs": 100_000})
