"""The sampler's logits processors against references written from their definitions.

- presence/frequency: OpenAI's formula, mu[j] - c[j] * frequency - (c[j] > 0) * presence, over
  the generated tokens only;
- repetition: transformers' `RepetitionPenaltyLogitsProcessor` over prompt + generated tokens;
- the documented order (allowed ids and bad words, logit bias, min_tokens, penalties, then
  temperature): a dense reference applying each step in that order, compared on random rows
  (hypothesis), and cases where another order gives another number;
- the incremental counts (`TokenCounts`, one scatter per step) equal a recount from the tokens
  at every step, through evictions (a preempted sequence's slot taken back) and releases.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.logits_processors import bad_words_token_ids, banned_bad_word_tokens
from batchgen.engine.sampler import Sampler, SampleRequest, sample
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.token_counts import TokenCounts

EOS = 3


def request(
    params: SamplingParams,
    tokens: list[int],
    num_prompt: int,
    *,
    row: int = 0,
    seq_id: int | None = None,
    seed: int = 0,
    words: tuple[tuple[int, ...], ...] = (),
) -> SampleRequest:
    return SampleRequest(
        row=row,
        params=params,
        seed=seed,
        token_idx=len(tokens) - num_prompt,
        seq_id=seq_id,
        token_ids=tokens,
        num_prompt_tokens=num_prompt,
        bad_words_token_ids=words,
    )


def reference_row(
    logits: torch.Tensor,
    params: SamplingParams,
    tokens: list[int],
    num_prompt: int,
    words: tuple[tuple[int, ...], ...] = (),
) -> torch.Tensor:
    """Steps 1-5 for one row, written out densely from each definition, in the documented order."""
    x = logits.clone().double()
    vocab = x.shape[0]
    generated = tokens[num_prompt:]
    if params.allowed_token_ids is not None:
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[list(params.allowed_token_ids)] = True
        x[~keep] = -math.inf
    for word in words:
        prefix = list(word[:-1])
        if len(prefix) <= len(generated) and (not prefix or generated[len(generated) - len(prefix) :] == prefix):
            x[word[-1]] = -math.inf
    for token, bias in (params.logit_bias or {}).items():
        x[token] += bias
    if len(generated) < params.min_tokens:
        for token in ([] if params.ignore_eos else [EOS]) + list(params.stop_token_ids):
            x[token] = -math.inf
    seen = set(tokens)
    for token in seen:  # transformers: score < 0 -> * penalty, else / penalty
        x[token] = x[token] * params.repetition_penalty if x[token] < 0 else x[token] / params.repetition_penalty
    counts = Counter(generated)  # OpenAI: generated tokens only
    for token, c in counts.items():
        x[token] -= c * params.frequency_penalty + (1.0 if c > 0 else 0.0) * params.presence_penalty
    return x.float()


def test_presence_and_frequency_follow_openai_formula() -> None:
    logits = torch.tensor([[1.0, -2.0, 0.5, 3.0, 0.0, 2.0]])
    prompt = [0, 5, 5]  # prompt tokens are not penalized by presence/frequency
    generated = [1, 1, 1, 2, 4]
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = Sampler().processed_logits(logits, [request(params, prompt + generated, len(prompt))])
    # token 1: -2 - 3*0.25 - 0.5; token 2: 0.5 - 0.25 - 0.5; token 4: 0 - 0.25 - 0.5
    assert out.tolist() == [[1.0, -3.25, -0.25, 3.0, -0.75, 2.0]]


def test_negative_presence_and_frequency_raise_seen_tokens() -> None:
    logits = torch.tensor([[1.0, -2.0, 0.5]])
    params = SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.5)
    out = Sampler().processed_logits(logits, [request(params, [0, 1, 1], 1)])
    assert out.tolist() == [[1.0, 0.0, 0.5]]


def test_repetition_penalty_equals_transformers_processor() -> None:
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 4
    histories = [[1, 2, 2, 7, 49], [0, 3], [10, 11, 12, 13, 10, 11]]
    prompts = [2, 1, 4]
    for penalty in (1.3, 0.7):
        params = SamplingParams(repetition_penalty=penalty)
        reqs = [request(params, h, n, row=i) for i, (h, n) in enumerate(zip(histories, prompts, strict=True))]
        ours = Sampler().processed_logits(logits, reqs)
        for i, history in enumerate(histories):
            ref = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([history]), logits[i : i + 1].clone())
            assert torch.equal(ours[i], ref[0])


def test_logit_bias_comes_before_the_repetition_penalty() -> None:
    # A seen token with logit 1, bias +1, repetition 2: (1 + 1) / 2 = 1 (the other order: 1.5).
    logits = torch.tensor([[1.0, 0.0]])
    params = SamplingParams(repetition_penalty=2.0, logit_bias={0: 1.0})
    assert Sampler().processed_logits(logits, [request(params, [0], 1)]).tolist() == [[1.0, 0.0]]
    # A negative logit -1, bias -1, repetition 2: (-1 - 1) * 2 = -4 (the other order: -3).
    params = SamplingParams(repetition_penalty=2.0, logit_bias={0: -1.0})
    assert Sampler().processed_logits(torch.tensor([[-1.0, 0.0]]), [request(params, [0], 1)]).tolist() == [[-4.0, 0.0]]


def test_repetition_before_frequency() -> None:
    # logit 3 on a token generated twice: 3 / 1.5 - 2 * 0.5 = 1 (the other order: (3 - 1) / 1.5).
    params = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5)
    out = Sampler().processed_logits(torch.tensor([[3.0, 0.0]]), [request(params, [1, 0, 0], 1)])
    assert out.tolist() == [[1.0, 0.0]]


def test_penalties_apply_before_temperature() -> None:
    # Sampled tokens equal those of a plain sampler over the reference-processed logits with
    # the same temperature and seeds; dividing by temperature first would change the draws.
    torch.manual_seed(1)
    logits = torch.randn(1, 8) * 2
    params = SamplingParams(temperature=0.5, frequency_penalty=1.5, presence_penalty=0.5)
    tokens = [0, 1, 1, 2, 2, 2]
    processed = reference_row(logits[0], params, tokens, 1)[None, :]
    plain = SamplingParams(temperature=0.5)
    for seed in range(200):
        ours = sample(logits, [request(params, tokens, 1, seed=seed)]).token_ids
        ref = sample(processed, [SampleRequest(row=0, params=plain, seed=seed, token_idx=5)]).token_ids
        assert ours == ref
    wrong = logits / 0.5
    wrong_processed = reference_row(wrong[0], params, tokens, 1)[None, :]
    assert not torch.allclose(wrong_processed * 0.5, processed)


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(1, 8)
    logits[0, EOS] = 50.0
    logits[0, 6] = 40.0
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[6])
    sampler = Sampler(eos_token_ids=[EOS])
    picks = [sampler.sample(logits, [request(params, [0] + [1] * g, 1)]).token_ids[0] for g in range(5)]
    assert picks == [0, 0, 0, EOS, EOS]  # tokens 0, 1, 2 may not stop; the 4th may
    ignore = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[6], ignore_eos=True)
    assert sampler.sample(logits, [request(ignore, [0], 1)]).token_ids == [EOS]  # EOS is no stop then


def test_allowed_token_ids_hold_under_sampling() -> None:
    logits = torch.full((1, 64), 10.0)  # every other token is far likelier
    logits[0, [5, 9, 60]] = torch.tensor([0.0, 0.5, -0.5])
    params = SamplingParams(temperature=1.5, allowed_token_ids=[5, 9, 60])
    drawn = {sample(logits, [request(params, [0], 1, seed=s)]).token_ids[0] for s in range(300)}
    assert drawn == {5, 9, 60}


def test_bad_words_ban_the_last_token_after_the_prefix() -> None:
    words = ((7,), (2, 4, 5))
    assert banned_bad_word_tokens([9, 9, 2, 4], 1, words) == [7, 5]
    assert banned_bad_word_tokens([9, 9, 2], 1, words) == [7]
    assert banned_bad_word_tokens([2, 4], 2, words) == [7]  # the prefix is in the prompt: not banned
    assert banned_bad_word_tokens([1, 2, 4], 1, words) == [7, 5]


def test_bad_words_tokenized_as_vllm() -> None:
    vocab = {"hello": [10], " hello": [11], "two words": [20, 21], " two words": [22, 21], "x": [30], " x": [30]}

    def encode(text: str) -> list[int]:
        return vocab[text]

    # " hello" adds a mid-text form; " x" encodes like "x" (same first token): one form.
    assert bad_words_token_ids(["hello", "  two words", "x"], encode) == ((10,), (11,), (20, 21), (22, 21), (30,))


def test_bad_words_hold_under_sampling() -> None:
    logits = torch.zeros(1, 16)
    logits[0, [4, 5]] = 5.0  # the bad word 4, 5 is likely, but 5 after 4 never comes
    params = SamplingParams(temperature=1.0, bad_words=["w"])
    for seed in range(100):
        r = request(params, [0, 4], 1, seed=seed, words=((4, 5),))
        assert sample(logits, [r]).token_ids[0] != 5


def test_a_batch_without_processors_reads_no_state() -> None:
    sampler = Sampler(eos_token_ids=[EOS])
    logits = torch.randn(4, 32)
    reqs = [request(SamplingParams(temperature=0), [1, 2], 1, row=i, seq_id=i) for i in range(4)]
    assert sampler.sample(logits, reqs).token_ids == logits.argmax(dim=-1).tolist()
    assert sampler.tracked_seq_ids == frozenset()


PARAMS = st.builds(
    SamplingParams,
    temperature=st.just(0.0),
    presence_penalty=st.sampled_from([0.0, 0.5, -1.0, 2.0]),
    frequency_penalty=st.sampled_from([0.0, 0.25, -0.5, 1.0]),
    repetition_penalty=st.sampled_from([1.0, 1.2, 0.8, 2.0]),
    min_tokens=st.integers(0, 4),
    max_tokens=st.just(16),
    logit_bias=st.one_of(st.none(), st.dictionaries(st.integers(0, 11), st.sampled_from([-5.0, 2.5, 100.0]), max_size=4)),
    allowed_token_ids=st.one_of(st.none(), st.lists(st.integers(0, 11), min_size=2, max_size=6, unique=True)),
    stop_token_ids=st.lists(st.integers(0, 11), max_size=2),
    ignore_eos=st.booleans(),
)


@settings(max_examples=200)
@given(
    rows=st.lists(
        st.tuples(PARAMS, st.lists(st.integers(0, 11), min_size=1, max_size=12), st.integers(1, 12)),
        min_size=1,
        max_size=5,
    ),
    seed=st.integers(0, 2**16),
)
def test_pipeline_equals_dense_reference(rows: list[tuple[SamplingParams, list[int], int]], seed: int) -> None:
    torch.manual_seed(seed)
    logits = torch.randn(len(rows), 12) * 3
    words = ((2, 7), (9,))
    reqs = []
    for i, (params, tokens, num_prompt) in enumerate(rows):
        n = min(num_prompt, len(tokens))
        if i % 2:  # the engine tokenizes `bad_words`; here the tokens are given
            reqs.append(request(params.replace(bad_words=["w"]), tokens, n, row=i, seq_id=i, words=words))
        else:
            reqs.append(request(params, tokens, n, row=i, seq_id=i))
    ours = Sampler(eos_token_ids=[EOS]).processed_logits(logits, reqs)
    for i, r in enumerate(reqs):
        ref = reference_row(logits[i], r.params, list(r.token_ids), r.num_prompt_tokens, r.bad_words_token_ids)
        assert torch.allclose(ours[i], ref, atol=1e-5, rtol=1e-6, equal_nan=False), (i, ours[i], ref)


@settings(max_examples=60)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(["draw", "draw", "draw", "release", "skip"])),
        min_size=1,
        max_size=60,
    ),
)
def test_incremental_counts_equal_a_recount(steps: list[tuple[int, str]]) -> None:
    """Six sequences drawn from in random subsets (a subset that leaves one out is a step it
    skipped, as when preempted), released at random; a pool of 2 slots forces evictions and
    rebuilds. After every step each sequence's penalized row equals the recount's."""
    vocab = 10
    sampler = Sampler()
    sampler._counts = TokenCounts(vocab, torch.device("cpu"), initial_slots=2)  # small pool
    params = SamplingParams(temperature=0.8, seed=1, presence_penalty=0.3, frequency_penalty=0.7, repetition_penalty=1.4)
    tokens = {s: [s, (s + 3) % vocab] for s in range(6)}
    next_id = 6
    ids = list(range(6))
    logits = torch.linspace(-2, 2, vocab)[None, :].repeat(6, 1)
    for pick, action in steps:
        seq = ids[pick]
        if action == "release":
            sampler.release(seq)
            ids[pick] = next_id  # a new sequence takes its place
            tokens[next_id] = [pick, 1]
            next_id += 1
            continue
        group = [ids[pick]] if action == "skip" else sorted({ids[pick], ids[(pick + 1) % 6], ids[(pick + 3) % 6]})
        reqs = [request(params, tokens[s], 2, row=i, seq_id=s, seed=s) for i, s in enumerate(group)]
        expected = [reference_row(logits[0], params, tokens[s], 2) for s in group]
        got = sampler.processed_logits(logits, reqs)
        for i in range(len(group)):
            assert torch.allclose(got[i], expected[i], atol=1e-5)
        drawn = sampler.sample(logits, reqs).token_ids
        for s, t in zip(group, drawn, strict=True):
            tokens[s].append(t)
    assert sampler.tracked_seq_ids <= set(ids)


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty", "repetition_penalty"])
def test_penalties_identical_alone_or_in_a_batch(penalty: str) -> None:
    torch.manual_seed(3)
    logits = torch.randn(5, 40) * 2
    value = 1.3 if penalty == "repetition_penalty" else 0.8
    params = [SamplingParams(temperature=0.9, **{penalty: value}), SamplingParams(temperature=0.9)]
    reqs = [request(params[i % 2], [i, i + 1, i + 1, 7], 2, row=i, seq_id=i, seed=10 + i) for i in range(5)]
    batched = Sampler().sample(logits, reqs).token_ids
    alone = [Sampler().sample(logits[i : i + 1], [request(params[i % 2], [i, i + 1, i + 1, 7], 2, seq_id=i, seed=10 + i)]).token_ids[0]
             for i in range(5)]
    assert batched == alone
