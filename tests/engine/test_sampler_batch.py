"""The batched sampler: each row's token does not depend on the other rows of its batch."""

from __future__ import annotations

import torch

from batchgen.engine.sampler import SampleRequest, sample
from batchgen.engine.sampling_params import SamplingParams

PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.0, top_k=5, seed=2),
    SamplingParams(temperature=0.7, top_p=0.9, seed=3),
    SamplingParams(temperature=1.2, min_p=0.05, seed=4),
    SamplingParams(temperature=0.9, top_k=20, top_p=0.5, min_p=0.01, seed=5),
    SamplingParams(temperature=0, logprobs=3),
]


def _requests(rows: list[int]) -> list[SampleRequest]:
    return [SampleRequest(row=i, params=PARAMS[r], seed=100 + r, token_idx=7) for i, r in enumerate(rows)]


def test_batched_draws_equal_single_row_draws() -> None:
    logits = torch.randn(len(PARAMS), 300, generator=torch.Generator().manual_seed(0))
    batched = sample(logits, _requests(list(range(len(PARAMS)))))
    for r in range(len(PARAMS)):
        alone = sample(logits[r : r + 1], _requests([r]))
        assert alone.token_ids[0] == batched.token_ids[r]
    # a different batch order and company gives the same tokens per request
    order = [5, 3, 1, 6, 0, 4, 2]
    shuffled = sample(logits[order], _requests(order))
    assert [shuffled.token_ids[order.index(r)] for r in range(len(PARAMS))] == batched.token_ids


def test_filters_keep_only_allowed_tokens() -> None:
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(1))
    top5 = set(torch.topk(logits[0], 5).indices.tolist())
    for seed in range(30):
        req = SampleRequest(row=0, params=SamplingParams(temperature=1.0, top_k=5), seed=seed, token_idx=0)
        assert sample(logits, [req]).token_ids[0] in top5
    greedy = SampleRequest(row=0, params=SamplingParams(temperature=0), seed=0, token_idx=0)
    assert sample(logits, [greedy]).token_ids[0] == int(logits[0].argmax())
    tight = SampleRequest(row=0, params=SamplingParams(temperature=1.0, top_p=1e-6), seed=3, token_idx=0)
    assert sample(logits, [tight]).token_ids[0] == int(logits[0].argmax())
