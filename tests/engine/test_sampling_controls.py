"""The vLLM/OpenAI sampling controls end to end on a tiny model, against references.

- `repetition_penalty`: greedy tokens equal transformers' `generate(repetition_penalty=...)`;
- presence/frequency: greedy tokens equal a loop over transformers' logits that applies
  OpenAI's formula to the generated tokens;
- `min_tokens` with EOS pushed up by `logit_bias` stops exactly after min_tokens tokens;
- `allowed_token_ids` and `bad_words` hold under sampling, over many seeds;
- seeded sampling with penalties is the same alone, in a batch and across preemption.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from batchgen import LLM, SamplingParams
from tests.tiny_models import make_tiny_hf_folder

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


@pytest.fixture(scope="module")
def llm(folder: Path) -> LLM:
    return LLM(str(folder), block_size=16, max_num_batched_tokens=64, seed=0)


@pytest.fixture(scope="module")
def hf_model(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def prompts(count: int = 5, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    # Repeated tokens in the prompt, so the repetition penalty has prompt tokens to act on.
    return [[rng.randrange(100, 400) for _ in range(n)] * 2 for n in (2, 5, 9, 13, 20)[:count]]


# Prompts after which this random model repeats tokens greedily (found by running it), so that a
# penalty above 1 changes its greedy tokens too.
REPEATING = [[45394, 45394], [41498, 41498, 41498], [2749, 6464, 2749, 6464]]


@pytest.mark.parametrize("penalty", [3.0, 0.4])
def test_repetition_penalty_matches_transformers_generate(llm: LLM, hf_model: torch.nn.Module, penalty: float) -> None:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, repetition_penalty=penalty)
    batch = prompts() + REPEATING
    outs = llm.generate(batch, params, use_tqdm=False)
    plain = llm.generate(batch, params.replace(repetition_penalty=1.0), use_tqdm=False)
    differs = 0
    for prompt, out, base in zip(batch, outs, plain, strict=True):
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([prompt]),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                repetition_penalty=penalty,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        assert list(out.outputs[0].token_ids) == ref
        differs += out.outputs[0].token_ids != base.outputs[0].token_ids
    assert differs >= 2  # the penalty changed the greedy tokens


def openai_reference(model: torch.nn.Module, prompt: list[int], presence: float, frequency: float) -> list[int]:
    """Greedy decoding over full forwards with OpenAI's formula:
    mu[j] - c[j] * frequency - (c[j] > 0) * presence, c[j] the count of j among generated tokens."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            counts = Counter(ids[len(prompt) :])
            for token, c in counts.items():
                logits[token] -= c * frequency + (c > 0) * presence
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt) :]


@pytest.mark.parametrize(("presence", "frequency"), [(1.5, 0.0), (0.0, 1.0), (0.8, 0.6), (-1.0, -0.5)])
def test_presence_frequency_match_openai_formula(
    llm: LLM, hf_model: torch.nn.Module, presence: float, frequency: float
) -> None:
    params = SamplingParams(
        temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, presence_penalty=presence, frequency_penalty=frequency
    )
    batch = prompts(count=2) + REPEATING[:2]
    outs = llm.generate(batch, params, use_tqdm=False)
    plain = llm.generate(batch, params.replace(presence_penalty=0.0, frequency_penalty=0.0), use_tqdm=False)
    for prompt, out in zip(batch, outs, strict=True):
        assert list(out.outputs[0].token_ids) == openai_reference(hf_model, prompt, presence, frequency)
    assert any(o.outputs[0].token_ids != b.outputs[0].token_ids for o, b in zip(outs, plain, strict=True))


def test_min_tokens_with_eos_pushed_up_stops_exactly_there(llm: LLM) -> None:
    eos = llm.tokenizer.eos_token_id
    assert eos is not None
    pushed = SamplingParams(temperature=0, max_tokens=30, logit_bias={eos: 100.0})
    first = llm.generate([[5, 6, 7]], pushed, use_tqdm=False)[0].outputs[0]
    assert first.token_ids == (eos,) and first.finish_reason == "stop"
    for min_tokens in (1, 4, 11):
        out = llm.generate([[5, 6, 7]], pushed.replace(min_tokens=min_tokens), use_tqdm=False)[0].outputs[0]
        assert len(out.token_ids) == min_tokens + 1
        assert eos not in out.token_ids[:min_tokens] and out.token_ids[-1] == eos
        assert (out.finish_reason, out.stop_reason) == ("stop", None)
    # A stop token id pushed up as well waits for min_tokens too.
    both = pushed.replace(min_tokens=6, logit_bias={eos: 100.0, 900: 100.0}, stop_token_ids=[900])
    out = llm.generate([[5, 6, 7]], both, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 7 and out.token_ids[-1] in (eos, 900)


def test_allowed_token_ids_hold_under_sampling(llm: LLM) -> None:
    allowed = [300, 301, 5000, 17000]
    params = SamplingParams(temperature=1.5, max_tokens=12, ignore_eos=True, allowed_token_ids=allowed)
    outs = llm.generate([[9, 8, 7]] * 40, [params.replace(seed=s) for s in range(40)], use_tqdm=False)
    drawn = Counter(t for o in outs for t in o.outputs[0].token_ids)
    assert set(drawn) == set(allowed)


def test_bad_words_hold_under_sampling(llm: LLM) -> None:
    tok = llm.tokenizer
    word = " Paris Texas"  # two tokens after a space
    ids = tok.encode(word, add_special_tokens=False)
    assert len(ids) == 2
    # Push the word's tokens up so that without the ban it comes often.
    bias = {ids[0]: 40.0, ids[1]: 40.0}
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, logit_bias=bias)
    seeds = range(30)
    free = llm.generate([[9, 8, 7]] * 30, [params.replace(seed=s) for s in seeds], use_tqdm=False)
    banned = llm.generate(
        [[9, 8, 7]] * 30, [params.replace(seed=s, bad_words=[word.strip()]) for s in seeds], use_tqdm=False
    )

    def pairs(token_ids: tuple[int, ...]) -> int:
        return sum(1 for a, b in itertools.pairwise(token_ids) if (a, b) == (ids[0], ids[1]))

    assert sum(pairs(o.outputs[0].token_ids) for o in free) >= 10
    assert sum(pairs(o.outputs[0].token_ids) for o in banned) == 0
    assert sum(o.outputs[0].token_ids.count(ids[0]) for o in banned) >= 10  # the first token alone stays
    assert all("Paris Texas" not in o.outputs[0].text for o in banned)


def test_single_token_bad_word_never_appears(llm: LLM) -> None:
    tok = llm.tokenizer
    ids = tok.encode(" the", add_special_tokens=False)
    plain = tok.encode("the", add_special_tokens=False)
    assert len(ids) == len(plain) == 1 and ids != plain
    bias = {ids[0]: 40.0, plain[0]: 40.0}
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, logit_bias=bias, bad_words=["the"])
    outs = llm.generate([[4, 5]] * 20, [params.replace(seed=s) for s in range(20)], use_tqdm=False)
    assert all(ids[0] not in o.outputs[0].token_ids and plain[0] not in o.outputs[0].token_ids for o in outs)


def test_every_allowed_token_banned_is_refused(llm: LLM) -> None:
    eos = llm.tokenizer.eos_token_id
    assert eos is not None
    with pytest.raises(ValueError, match="every allowed token is banned"):
        llm.engine.add_request([1, 2], SamplingParams(allowed_token_ids=[eos], min_tokens=2))
    with pytest.raises(ValueError, match=r"SamplingParams.logit_bias: token id 49152 is outside the vocabulary"):
        llm.engine.add_request([1, 2], SamplingParams(logit_bias={49152: 1.0}))


def test_seeded_penalties_alone_in_a_batch_and_across_preemption(folder: Path) -> None:
    rng = random.Random(5)
    shared = [rng.randrange(1000, 20000) for _ in range(13)]
    batch = [shared[: rng.randint(0, 13)] + [rng.randrange(1000, 20000) for _ in range(rng.randint(1, 9))]
             for _ in range(8)]
    params = [
        SamplingParams(temperature=0.9, seed=100 + i, max_tokens=20, ignore_eos=True, n=2 if i % 3 == 0 else 1,
                       presence_penalty=0.5 * (i % 3), frequency_penalty=0.4, repetition_penalty=1.0 + 0.2 * (i % 2))
        for i in range(len(batch))
    ]

    def run(prompts_: list[list[int]], params_: list[SamplingParams], **options: object) -> tuple[list[list[tuple[int, ...]]], dict[str, int]]:
        llm = LLM(str(folder), seed=0, **options)  # type: ignore[arg-type]
        outs = llm.generate(prompts_, params_, use_tqdm=False)
        assert llm.engine.sampler.tracked_seq_ids == frozenset()  # all released at finish
        return [[c.token_ids for c in o.outputs] for o in outs], llm.stats()

    baseline, stats = run(batch, params, max_num_batched_tokens=None)
    assert stats["num_preemptions"] == 0
    alone = [run([p], [sp])[0][0] for p, sp in zip(batch[:3], params[:3], strict=True)]
    assert alone == baseline[:3]
    preempted, stats = run(batch, params, block_size=4, num_kv_blocks=12, max_model_len=48,
                           max_num_batched_tokens=16, admission_reserve_tokens=0)
    assert stats["num_preemptions"] >= 10
    assert preempted == baseline
    unpenalized, _ = run(batch, [p.replace(presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0) for p in params],
                         max_num_batched_tokens=None)
    assert unpenalized != baseline
