"""Token sampling: greedy, temperature, top-k, top-p, min-p, with per-request reproducibility.

A sampled row draws its randomness from a generator seeded by (request seed, index of the
token being generated), so a seeded request gets the same tokens whatever shares its batch and
across preemption. Greedy rows are one batched argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.seeding import derive_seed

__all__ = ["SampleRequest", "SampleResult", "sample"]


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """Draw one token from logits row `row` for the `token_idx`-th generated token."""

    row: int
    params: SamplingParams
    seed: int
    token_idx: int


@dataclass(frozen=True, slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


def _filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    x = logits / params.temperature
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        # Exactly top_k tokens stay; among equal logits the lower token ids (a stable sort).
        kept = torch.sort(x, descending=True, stable=True).indices[: params.top_k]
        dropped = torch.ones_like(x, dtype=torch.bool).index_fill_(0, kept, False)
        x = x.masked_fill(dropped, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_probs, dim=-1) / sorted_probs.sum()
        # Drop a token when the tokens ranked above it already reach top_p; the top one stays.
        drop = (cum - sorted_probs / sorted_probs.sum()) >= params.top_p
        probs = probs.scatter(0, order[drop], 0.0)
    return probs


def _draw(probs: torch.Tensor, seed: int) -> int:
    gen = torch.Generator(device=probs.device)
    gen.manual_seed(seed)
    # Exponential race: argmax p_i / E_i with E_i ~ Exp(1) picks i with probability p_i.
    noise = torch.empty_like(probs).exponential_(generator=gen)
    # A draw of exactly 0 gives p/0: inf for a kept token (it wins, as its E_i is the smallest)
    # but NaN for a filtered one, which argmax would pick; filtered tokens never compete.
    scores = (probs / noise).masked_fill(probs <= 0, -1.0)
    return int(torch.argmax(scores).item())


def sample(logits: torch.Tensor, requests: Sequence[SampleRequest]) -> SampleResult:
    """One token per request (several requests may share a row: the samples of one prompt)."""
    tokens = [0] * len(requests)
    greedy = [i for i, r in enumerate(requests) if r.params.is_greedy]
    if greedy:
        rows = torch.tensor([requests[i].row for i in greedy], device=logits.device)
        picked = torch.argmax(logits.index_select(0, rows), dim=-1).tolist()
        for i, token in zip(greedy, picked, strict=True):
            tokens[i] = int(token)
    for i, req in enumerate(requests):
        if not req.params.is_greedy:
            probs = _filtered_probs(logits[req.row], req.params)
            tokens[i] = _draw(probs, derive_seed(req.seed, req.token_idx))
    logprobs: list[dict[int, float] | None] = [None] * len(requests)
    want = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
    if want:
        all_logprobs = torch.log_softmax(logits, dim=-1)
        for i in want:
            req = requests[i]
            row = all_logprobs[req.row]
            entry: dict[int, float] = {}
            k = req.params.logprobs or 0
            if k > 0:
                top = torch.topk(row, k)
                entry = {int(t): float(v) for t, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)}
            entry[tokens[i]] = float(row[tokens[i]])
            logprobs[i] = entry
    return SampleResult(token_ids=tokens, logprobs=logprobs)
