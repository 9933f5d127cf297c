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
from batchgen.kernels import argmax

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


def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Probabilities [rows, vocab] after temperature, top-k, min-p and top-p, one params per row.

    Row-wise ops over the whole batch; the arithmetic of each row is that of a lone row.
    """
    dev = logits.device
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=dev)
    x = logits / temps[:, None]
    vocab = x.shape[-1]
    top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(top_k):
        k = torch.tensor([k or vocab for k in top_k], device=dev)
        # Exactly k tokens stay; among equal logits the lower token ids (a stable sort).
        order = torch.sort(x, dim=-1, descending=True, stable=True).indices
        ranked_drop = torch.arange(vocab, device=dev)[None, :] >= k[:, None]
        dropped = torch.zeros_like(x, dtype=torch.bool).scatter_(1, order, ranked_drop)
        x = x.masked_fill(dropped, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if any(p.min_p > 0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype, device=dev)
        probs = probs.masked_fill(probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)
    if any(p.top_p < 1 for p in params):
        top_p = torch.tensor([p.top_p for p in params], dtype=probs.dtype, device=dev)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        total = sorted_probs.sum(dim=-1, keepdim=True)
        cum = torch.cumsum(sorted_probs, dim=-1) / total
        # Drop a token when the tokens ranked above it already reach top_p; the top one stays.
        drop = ((cum - sorted_probs / total) >= top_p[:, None]) & (top_p < 1)[:, None]
        probs = probs.scatter(1, order, sorted_probs.masked_fill(drop, 0.0))
    return probs


def _draw(probs: torch.Tensor, seeds: Sequence[int]) -> list[int]:
    """One token per row. Each row's noise comes from its own generator, seeded per row, so a
    row's draw does not depend on the other rows of the batch."""
    noise = torch.empty_like(probs)
    gen = torch.Generator(device=probs.device)
    for i, seed in enumerate(seeds):
        gen.manual_seed(seed)
        noise[i].exponential_(generator=gen)
    # Exponential race: argmax p_i / E_i with E_i ~ Exp(1) picks i with probability p_i.
    # A draw of exactly 0 gives p/0: inf for a kept token (it wins, as its E_i is the smallest)
    # but NaN for a filtered one, which argmax would pick; filtered tokens never compete.
    scores = (probs / noise).masked_fill(probs <= 0, -1.0)
    return [int(t) for t in torch.argmax(scores, dim=-1).tolist()]


def sample(logits: torch.Tensor, requests: Sequence[SampleRequest]) -> SampleResult:
    """One token per request (several requests may share a row: the samples of one prompt).

    Greedy requests: one argmax over their rows. Sampled ones: filtered and drawn as one batch.
    """
    tokens = [0] * len(requests)
    greedy = [i for i, r in enumerate(requests) if r.params.is_greedy]
    if len(greedy) == len(requests) and [r.row for r in requests] == list(range(logits.shape[0])):
        tokens = [int(t) for t in argmax(logits).tolist()]  # the usual case: no gather
    elif greedy:
        rows = torch.tensor([requests[i].row for i in greedy], device=logits.device)
        picked = argmax(logits.index_select(0, rows)).tolist()
        for i, token in zip(greedy, picked, strict=True):
            tokens[i] = int(token)
    sampled = [i for i, r in enumerate(requests) if not r.params.is_greedy]
    if sampled:
        rows = torch.tensor([requests[i].row for i in sampled], device=logits.device)
        probs = _filtered_probs(logits.index_select(0, rows), [requests[i].params for i in sampled])
        drawn = _draw(probs, [derive_seed(requests[i].seed, requests[i].token_idx) for i in sampled])
        for i, token in zip(sampled, drawn, strict=True):
            tokens[i] = token
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
