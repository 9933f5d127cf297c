"""skip_special_tokens, include_stop_str_in_output and min_tokens' hold on stop strings (vLLM:
a stop string completed by the first min_tokens tokens does not stop), in the detokenizer and
through the engine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from batchgen import LLM, SamplingParams
from batchgen.engine.detokenizer import IncrementalDetokenizer
from tests.tiny_models import make_tiny_hf_folder

SPECIAL = 0


class ByteDecoder:
    """Token t (1..255) is the byte t; token 0 is a special token, "<s>" unless skipped."""

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        parts = [b"<s>" if t == SPECIAL else bytes([t]) for t in token_ids if t != SPECIAL or not skip_special_tokens]
        return b"".join(parts).decode("utf-8", errors="replace")


def run(detok: IncrementalDetokenizer, text_tokens: list[int]) -> tuple[int, str | None]:
    """Feed one token at a time; (tokens fed when a stop string matched, or all, and the string)."""
    for n, token in enumerate(text_tokens, start=1):
        matched = detok.update([token])
        if matched is not None:
            return n, matched
    return len(text_tokens), detok.finish()


def test_include_stop_str_keeps_the_string() -> None:
    tokens = list(b"abc STOP def")
    plain = IncrementalDetokenizer(ByteDecoder(), ("STOP",))
    assert run(plain, tokens) == (8, "STOP") and plain.text == "abc "
    kept = IncrementalDetokenizer(ByteDecoder(), ("STOP",), include_stop_str=True)
    assert run(kept, tokens) == (8, "STOP") and kept.text == "abc STOP"


def test_stop_strings_wait_for_min_tokens() -> None:
    tokens = list(b"xyxyxy")
    assert run(IncrementalDetokenizer(ByteDecoder(), ("xy",)), tokens)[0] == 2
    # "xy" ends at tokens 2, 4, 6: with min_tokens=2 the second one (token 4) stops, as in vLLM,
    # whose check runs once more than min_tokens tokens came.
    detok = IncrementalDetokenizer(ByteDecoder(), ("xy",), min_tokens=2)
    assert run(detok, tokens) == (4, "xy") and detok.text == "xy"
    detok = IncrementalDetokenizer(ByteDecoder(), ("xy",), min_tokens=3)
    assert run(detok, tokens) == (4, "xy")
    detok = IncrementalDetokenizer(ByteDecoder(), ("xy",), min_tokens=4)
    assert run(detok, tokens) == (6, "xy") and detok.text == "xyxy"


def test_skip_special_tokens_in_the_detokenizer() -> None:
    tokens = [ord("a"), SPECIAL, ord("b")]
    skipped = IncrementalDetokenizer(ByteDecoder(), ("zz",))
    run(skipped, tokens)
    kept = IncrementalDetokenizer(ByteDecoder(), ("zz",), skip_special_tokens=False)
    run(kept, tokens)
    assert (skipped.text, kept.text) == ("ab", "a<s>b")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder: Path = make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)
    return LLM(str(folder), seed=0)


@pytest.mark.parametrize("with_stop", [False, True])
def test_skip_special_tokens_through_the_engine(llm: LLM, with_stop: bool) -> None:
    tok = llm.tokenizer
    eos = tok.eos_token_id
    assert eos is not None
    word = tok.encode("hello", add_special_tokens=False)
    allowed = [eos, *word]
    stop = ["never seen"] if with_stop else []  # with a stop string the detokenizer decodes
    # A high temperature flattens the two allowed tokens' odds: both come.
    params = SamplingParams(temperature=100.0, seed=1, max_tokens=12, ignore_eos=True, allowed_token_ids=allowed,
                            stop=stop)
    skipped = llm.generate([[5, 6]], params, use_tqdm=False)[0].outputs[0]
    kept = llm.generate([[5, 6]], params.replace(skip_special_tokens=False), use_tqdm=False)[0].outputs[0]
    assert skipped.token_ids == kept.token_ids and eos in kept.token_ids
    assert kept.text == tok.decode(list(kept.token_ids), skip_special_tokens=False)
    assert skipped.text == tok.decode(list(kept.token_ids), skip_special_tokens=True)
    assert tok.decode([eos], skip_special_tokens=False) in kept.text
    assert kept.text != skipped.text


def test_include_stop_str_and_min_tokens_through_the_engine(llm: LLM) -> None:
    tok = llm.tokenizer
    ids = tok.encode(" cat", add_special_tokens=False)
    assert len(ids) == 1
    # Only " cat" can be drawn: the text is " cat cat cat ...".
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, allowed_token_ids=ids, stop=["cat"])
    out = llm.generate([[5, 6]], params, use_tqdm=False)[0].outputs[0]
    assert (out.text, len(out.token_ids), out.stop_reason) == (" ", 1, "cat")
    out = llm.generate([[5, 6]], params.replace(include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert (out.text, len(out.token_ids)) == (" cat", 1)
    out = llm.generate([[5, 6]], params.replace(min_tokens=3), use_tqdm=False)[0].outputs[0]
    assert (out.text, len(out.token_ids), out.finish_reason) == (" cat cat cat ", 4, "stop")
