"""How generation ends, on a tiny random model: EOS (also from generation_config.json), stop
tokens, stop strings completed by the last token, and text equal to the decode of the tokens."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest

from batchgen import LLM, SamplingParams
from batchgen.engine.detokenizer import IncrementalDetokenizer
from batchgen.engine.sampling_params import MAX_STOP_CHARS, MAX_STOPS
from tests.engine.test_detokenizer import ByteDecoder, byte_tokens, feed
from tests.tiny_models import make_tiny_hf_folder

PROMPT = [1500, 1600, 1700, 1800, 1900]
NUM_FREE = 24


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


@pytest.fixture(scope="module")
def llm(folder: Path) -> LLM:
    return LLM(str(folder), seed=0)


@pytest.fixture(scope="module")
def free_tokens(llm: LLM) -> tuple[int, ...]:
    """The greedy continuation of PROMPT, without stops."""
    params = SamplingParams(temperature=0, max_tokens=NUM_FREE, ignore_eos=True)
    return llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids


def _new_token_position(tokens: tuple[int, ...], start: int) -> int:
    """The first position >= start whose token did not occur before it."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def _completed_stop(llm: LLM, tokens: tuple[int, ...], k: int) -> str:
    """A stop string that the text of tokens[:k+1] ends with and that of tokens[:k] lacks."""
    before = llm.tokenizer.decode(list(tokens[:k]))
    after = llm.tokenizer.decode(list(tokens[: k + 1]))
    for length in range(1, len(after) + 1):
        stop = after[-length:]
        if stop.strip() and stop not in before and after.index(stop) == len(after) - length:
            return stop
    raise AssertionError("no stop string ends at this token")


def test_stop_string_completed_by_the_last_allowed_token(llm: LLM, free_tokens: tuple[int, ...]) -> None:
    k = 9
    stop = _completed_stop(llm, free_tokens, k)
    params = SamplingParams(temperature=0, max_tokens=k + 1, ignore_eos=True, stop=[stop])
    out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free_tokens[: k + 1]  # the length limit ended it too
    text = llm.tokenizer.decode(list(free_tokens[: k + 1]))
    assert out.text == text[: len(text) - len(stop)]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_stop_string_completed_by_a_stop_token(llm: LLM, free_tokens: tuple[int, ...]) -> None:
    k = _new_token_position(free_tokens, 6)
    stop = _completed_stop(llm, free_tokens, k)
    params = SamplingParams(
        temperature=0, max_tokens=NUM_FREE, ignore_eos=True, stop=[stop], stop_token_ids=[free_tokens[k]]
    )
    out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free_tokens[: k + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_stops_at_eos_from_generation_config(folder: Path, free_tokens: tuple[int, ...], tmp_path: Path) -> None:
    # A chat model's end-of-turn token is often listed only in generation_config.json.
    k = _new_token_position(free_tokens, 7)
    eos = free_tokens[k]
    copy = Path(shutil.copytree(folder, tmp_path / "with-generation-config"))
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, 2]}))
    llm = LLM(str(copy), seed=0)
    assert eos in llm.engine.eos_token_ids
    params = SamplingParams(temperature=0, max_tokens=NUM_FREE)
    out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", None)
    assert out.token_ids == free_tokens[: k + 1]  # the EOS token is the last one
    assert out.text == llm.tokenizer.decode(list(free_tokens[: k + 1]))
    # ignore_eos runs past it
    params = SamplingParams(temperature=0, max_tokens=NUM_FREE, ignore_eos=True)
    out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free_tokens and out.finish_reason == "length"
    # a stop string completed by the EOS token itself is the reason
    stop = _completed_stop(llm, free_tokens, k)
    params = SamplingParams(temperature=0, max_tokens=NUM_FREE, stop=[stop])
    out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free_tokens[: k + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_text_is_the_decode_of_the_token_ids(llm: LLM) -> None:
    rng = random.Random(5)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randint(3, 20))] for _ in range(6)]
    for stop in ((), ("\x00never",)):  # without stop strings, and through the detokenizer
        params = SamplingParams(temperature=0.8, seed=3, max_tokens=40, ignore_eos=True, stop=stop)
        for out in llm.generate(prompts, params, use_tqdm=False):
            completion = out.outputs[0]
            assert completion.finish_reason == "length"
            assert completion.text == llm.tokenizer.decode(list(completion.token_ids))


def test_logprobs_beyond_the_vocabulary_are_refused(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a vocabulary under MAX_LOGPROBS tokens can get here; shrink the engine's view of it.
    small = dataclasses.replace(llm.engine.model_config, vocab_size=10)
    monkeypatch.setattr(llm.engine, "model_config", small)
    with pytest.raises(ValueError, match="logprobs=11 exceeds the vocabulary of 10 tokens"):
        llm.engine.add_request([1, 2, 3], SamplingParams(logprobs=11))
    assert not llm.engine.has_unfinished()


def test_stop_lists_are_capped_in_count_and_length() -> None:
    # Stops are searched at every token of every sample: a row may not ask for thousands.
    params = SamplingParams(stop=["s" * MAX_STOP_CHARS] * MAX_STOPS, stop_token_ids=[1] * MAX_STOPS)
    assert len(params.stop_strings) == MAX_STOPS == 64 and MAX_STOP_CHARS == 512
    with pytest.raises(ValueError, match="SamplingParams.stop may hold at most 64 entries, got 65"):
        SamplingParams(stop=["s"] * (MAX_STOPS + 1))
    with pytest.raises(ValueError, match="SamplingParams.stop_token_ids may hold at most 64 entries, got 100000"):
        SamplingParams(stop_token_ids=[1] * 100_000)
    with pytest.raises(ValueError, match="at most 512 characters long, got one of 513"):
        SamplingParams(stop=["x" * (MAX_STOP_CHARS + 1)])
    with pytest.raises(ValueError, match="at most 512 characters long, got one of 100000"):
        SamplingParams(stop="x" * 100_000)


def test_the_longest_allowed_stop_string_is_found_across_tokens() -> None:
    stop = "ab" * (MAX_STOP_CHARS // 2)
    others = tuple(f"{k:03d}" + "z" * (MAX_STOP_CHARS - 3) for k in range(MAX_STOPS - 1))
    detok = IncrementalDetokenizer(ByteDecoder(), (*others, stop))
    assert feed(detok, byte_tokens("x" * 1000 + "a" + stop + "tail")) == stop
    assert detok.text == "x" * 1000 + "a"
