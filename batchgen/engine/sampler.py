"""Token sampling: a fixed pipeline of logits processors, then greedy or seeded draws.

The pipeline, in this order (each step vectorized over the rows that use it and skipped when
none does; a batch without any of them pays nothing):

    1. allowed_token_ids and bad_words   (`logits_processors.keep_only`, `ban_tokens`)
    2. logit_bias                        (`add_bias`)
    3. min_tokens                        (EOS and stop token ids -> -inf; `ban_tokens`)
    4. presence / frequency / repetition penalties   (`penalize`, over `TokenCounts`)
    5. grammar mask                      (structured output: each constrained row's tokens
                                          that its grammar forbids -> -inf, one call over
                                          those rows, `structured.mask.apply_grammar_mask`;
                                          the engine's `GrammarMask`. Where the processors
                                          before it left nothing the grammar allows, the
                                          grammar wins: the row is its raw logits masked)
    6. temperature, then top-k, min-p, top-p
    7. sample: one batched argmax for greedy rows, an exponential race for sampled ones

Log-probabilities are those of the raw logits, before the pipeline (vLLM's default).

`Sampler` owns the per-sequence state the pipeline reads, keyed by seq_id: token counts for
the penalties (`TokenCounts`, rebuilt from a sequence's tokens whenever they disagree, as
after a preemption's recompute) and per-sequence tensors of its allowed ids and logit bias. A
sampled row draws its randomness from a generator seeded by (request seed, index of the token
being generated), so a seeded request gets the same tokens whatever shares its batch and
across preemption.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from batchgen.engine.logits_processors import (
    add_bias,
    ban_tokens,
    banned_bad_word_tokens,
    keep_only,
    penalize,
)
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.seeding import derive_seed
from batchgen.engine.structured.mask import apply_grammar_mask
from batchgen.engine.structured.runtime import GrammarMask
from batchgen.engine.token_counts import TokenCounts
from batchgen.kernels import argmax

__all__ = ["SampleRequest", "SampleResult", "Sampler", "sample"]


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """Draw one token from logits row `row` for the `token_idx`-th generated token.

    The processors that read a sequence's history use the rest: `seq_id` keys its state
    (None: nothing kept between calls), `token_ids` are its tokens so far, prompt then
    generated (read only, never kept), `num_prompt_tokens` where the generated ones start, and
    `bad_words_token_ids` its tokenized bad words (`logits_processors.bad_words_token_ids`).
    """

    row: int
    params: SamplingParams
    seed: int
    token_idx: int
    seq_id: int | None = None
    token_ids: Sequence[int] = ()
    num_prompt_tokens: int = 0
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


@dataclass(frozen=True, slots=True)
class _SeqTensors:
    """A sequence's fixed processor inputs, on the logits' device (built once per sequence)."""

    allowed_ids: torch.Tensor | None
    bias_ids: torch.Tensor | None
    bias_values: torch.Tensor | None


class Sampler:
    """Runs the pipeline for a step's requests; owns per-sequence state keyed by seq_id
    (`release` it when a sequence finishes). Not thread-safe: the engine's step thread owns it.
    `eos_token_ids` are what min_tokens masks besides a request's stop token ids."""

    def __init__(self, eos_token_ids: Iterable[int] = ()) -> None:
        self._eos_token_ids = tuple(sorted(set(eos_token_ids)))
        self._counts: TokenCounts | None = None
        self._tensors: dict[int, _SeqTensors] = {}

    @property
    def tracked_seq_ids(self) -> frozenset[int]:
        """Sequences with state held (token counts or tensors)."""
        counted = frozenset() if self._counts is None else self._counts.seq_ids
        return counted | frozenset(self._tensors)

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence's state (no-op if it has none)."""
        self._tensors.pop(seq_id, None)
        if self._counts is not None:
            self._counts.release(seq_id)

    def sample(
        self, logits: torch.Tensor, requests: Sequence[SampleRequest], grammar: GrammarMask | None = None
    ) -> SampleResult:
        """One token per request (several requests may share a row: the samples of one prompt).
        `grammar`: the allowed tokens of the constrained requests, by seq_id."""
        active = [i for i, r in enumerate(requests) if r.params.has_logits_processors]
        penalty_state: tuple[list[int], torch.Tensor] | None = None
        if active:
            # One row per request (a copy: the raw logits stay for the log-probabilities).
            index = torch.tensor([r.row for r in requests], device=logits.device)
            scores = logits.index_select(0, index)
            penalty_state = self._process(scores, requests, active)
            if grammar is not None and grammar.seq_ids:
                _mask_grammar_rows(scores, logits, requests, grammar)
            rows = list(range(len(requests)))
        else:
            scores = logits
            rows = [r.row for r in requests]
        tokens = _select(scores, rows, requests)
        if penalty_state is not None:
            keys, slots = penalty_state
            assert self._counts is not None
            drawn = torch.tensor([tokens[i] for i in _penalty_rows(requests)], device=logits.device)
            self._counts.add(keys, slots, drawn)
            for key in keys:
                if key < 0:
                    self._counts.release(key)  # a request without a seq_id keeps nothing
        return SampleResult(token_ids=tokens, logprobs=_logprobs(logits, requests, tokens))

    def processed_logits(self, logits: torch.Tensor, requests: Sequence[SampleRequest]) -> torch.Tensor:
        """Steps 1-5 of the pipeline: one row per request (float32 [requests, vocab]), what
        temperature and the filters then see. Counts nothing (no token is drawn)."""
        index = torch.tensor([r.row for r in requests], device=logits.device)
        scores = logits.index_select(0, index)
        active = [i for i, r in enumerate(requests) if r.params.has_logits_processors]
        if active:
            state = self._process(scores, requests, active)
            if state is not None and self._counts is not None:
                for key in state[0]:
                    if key < 0:
                        self._counts.release(key)
        return scores

    # ------------------------------------------------------------- pipeline
    def _process(
        self, x: torch.Tensor, requests: Sequence[SampleRequest], active: list[int]
    ) -> tuple[list[int], torch.Tensor] | None:
        """Steps 1-5 on `x` (row i is request i), in place. Returns the penalty rows' state
        keys and slots, for counting the drawn tokens."""
        dev = x.device
        # 1. allowed ids and bad words
        allowed = [i for i in active if requests[i].params.allowed_token_ids is not None]
        if allowed:
            ids = [self._seq_tensors(requests[i], dev).allowed_ids for i in allowed]
            lengths = torch.tensor([int(t.shape[0]) for t in ids if t is not None], device=dev)
            keep_only(
                x,
                torch.tensor(allowed, device=dev),
                torch.repeat_interleave(torch.arange(len(allowed), device=dev), lengths),
                torch.cat([t for t in ids if t is not None]),
            )
        banned_rows: list[int] = []
        banned_ids: list[int] = []
        for i in active:
            r = requests[i]
            if r.bad_words_token_ids:
                banned = banned_bad_word_tokens(r.token_ids, r.num_prompt_tokens, r.bad_words_token_ids)
                banned_rows.extend([i] * len(banned))
                banned_ids.extend(banned)
        if banned_ids:
            ban_tokens(x, torch.tensor(banned_rows, device=dev), torch.tensor(banned_ids, device=dev))
        # 2. logit bias
        biased = [i for i in active if requests[i].params.logit_bias]
        if biased:
            tensors = [self._seq_tensors(requests[i], dev) for i in biased]
            bias_ids = [t.bias_ids for t in tensors if t.bias_ids is not None]
            bias_values = [t.bias_values for t in tensors if t.bias_values is not None]
            lengths = torch.tensor([int(t.shape[0]) for t in bias_ids], device=dev)
            add_bias(
                x,
                torch.repeat_interleave(torch.tensor(biased, device=dev), lengths),
                torch.cat(bias_ids),
                torch.cat(bias_values),
            )
        # 3. min_tokens: no EOS or stop token before it (nor a stop string: see the detokenizer)
        stop_rows: list[int] = []
        stop_ids: list[int] = []
        vocab = x.shape[1]
        for i in active:
            r = requests[i]
            if r.token_idx < r.params.min_tokens:
                eos = () if r.params.ignore_eos else self._eos_token_ids
                ids_ = sorted({t for t in (*eos, *r.params.stop_token_ids) if t < vocab})
                stop_rows.extend([i] * len(ids_))
                stop_ids.extend(ids_)
        if stop_ids:
            ban_tokens(x, torch.tensor(stop_rows, device=dev), torch.tensor(stop_ids, device=dev))
        # 4. penalties
        result = None
        penalized = _penalty_rows(requests)
        if penalized:
            result = self._penalize(x, requests, penalized)
        # 5. grammar mask: `sample` applies it after this (it needs the raw logits too).
        return result

    def _penalize(
        self, x: torch.Tensor, requests: Sequence[SampleRequest], penalized: list[int]
    ) -> tuple[list[int], torch.Tensor]:
        if self._counts is None:
            self._counts = TokenCounts(x.shape[1], x.device)
        # A request without a seq_id gets a key of its own for this call only.
        keys = [_state_key(requests[i], i) for i in penalized]
        slots = self._counts.lookup(
            keys, [requests[i].token_ids for i in penalized], [requests[i].num_prompt_tokens for i in penalized]
        )
        history = self._counts.history(slots, max(len(requests[i].token_ids) for i in penalized))
        params = [requests[i].params for i in penalized]
        dev = x.device
        penalize(
            x,
            torch.tensor(penalized, device=dev),
            history,
            presence=torch.tensor([p.presence_penalty for p in params], dtype=torch.float32, device=dev),
            frequency=torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32, device=dev),
            repetition=torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=dev),
        )
        return keys, slots

    def _seq_tensors(self, request: SampleRequest, device: torch.device) -> _SeqTensors:
        cached = self._tensors.get(request.seq_id) if request.seq_id is not None else None
        if cached is not None:
            return cached
        p = request.params
        bias = p.logit_bias or {}
        tensors = _SeqTensors(
            allowed_ids=None
            if p.allowed_token_ids is None
            else torch.tensor(sorted(set(p.allowed_token_ids)), dtype=torch.int64, device=device),
            bias_ids=torch.tensor(list(bias), dtype=torch.int64, device=device) if bias else None,
            bias_values=torch.tensor([float(v) for v in bias.values()], dtype=torch.float32, device=device)
            if bias
            else None,
        )
        if request.seq_id is not None:
            self._tensors[request.seq_id] = tensors
        return tensors


def _mask_grammar_rows(
    x: torch.Tensor, raw: torch.Tensor, requests: Sequence[SampleRequest], grammar: GrammarMask
) -> None:
    """Step 5 on `x` (row i is request i): the grammar mask over the constrained requests, in one
    call. A row that the earlier processors left without any token its grammar allows (say
    allowed_token_ids outside the grammar) takes its raw logits masked by the grammar alone,
    so that a constrained row always draws a token its grammar accepts."""
    position = {r.seq_id: i for i, r in enumerate(requests) if r.seq_id is not None}
    rows = [position[seq_id] for seq_id in grammar.seq_ids]
    for k in apply_grammar_mask(x, torch.tensor(rows, device=x.device), grammar.bitmask):
        i = rows[k]
        x[i] = raw[requests[i].row]
        apply_grammar_mask(x, torch.tensor([i], device=x.device), grammar.bitmask[k : k + 1])


def _state_key(request: SampleRequest, position: int) -> int:
    """The request's seq_id, or for one without a key of its own for this call only."""
    return -1 - position if request.seq_id is None else request.seq_id


def _penalty_rows(requests: Sequence[SampleRequest]) -> list[int]:
    return [i for i, r in enumerate(requests) if r.params.has_penalties]


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


def _select(scores: torch.Tensor, rows: list[int], requests: Sequence[SampleRequest]) -> list[int]:
    """Steps 6 and 7: request i draws from scores[rows[i]]. Greedy requests: one argmax over
    their rows; sampled ones: filtered and drawn as one batch."""
    tokens = [0] * len(requests)
    greedy = [i for i, r in enumerate(requests) if r.params.is_greedy]
    if len(greedy) == len(requests) and rows == list(range(scores.shape[0])):
        tokens = [int(t) for t in argmax(scores).tolist()]  # the usual case: no gather
    elif greedy:
        index = torch.tensor([rows[i] for i in greedy], device=scores.device)
        picked = argmax(scores.index_select(0, index)).tolist()
        for i, token in zip(greedy, picked, strict=True):
            tokens[i] = int(token)
    sampled = [i for i, r in enumerate(requests) if not r.params.is_greedy]
    if sampled:
        index = torch.tensor([rows[i] for i in sampled], device=scores.device)
        probs = _filtered_probs(scores.index_select(0, index), [requests[i].params for i in sampled])
        drawn = _draw(probs, [derive_seed(requests[i].seed, requests[i].token_idx) for i in sampled])
        for i, token in zip(sampled, drawn, strict=True):
            tokens[i] = token
    return tokens


def _logprobs(
    logits: torch.Tensor, requests: Sequence[SampleRequest], tokens: list[int]
) -> list[dict[int, float] | None]:
    """The raw logits' log-probabilities of the drawn token and the top-k, where asked."""
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
    return logprobs


def sample(
    logits: torch.Tensor, requests: Sequence[SampleRequest], eos_token_ids: Iterable[int] = ()
) -> SampleResult:
    """One token per request with a fresh `Sampler` (no state kept between calls: penalties
    count each request's `token_ids` anew)."""
    return Sampler(eos_token_ids).sample(logits, requests)
