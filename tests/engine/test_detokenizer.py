"""IncrementalDetokenizer: text equal to a full decode, multi-byte characters split across tokens,
stop strings across such a split, the flush at finish, and a cost that does not grow."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from batchgen.engine.detokenizer import IncrementalDetokenizer
from tests.tiny_models import smollm2_tokenizer

SPECIAL = 0


class ByteDecoder:
    """Token t (1..255) is the byte t; token 0 is a special token (skipped). Counts the tokens
    it decodes, the work a detokenizer does."""

    def __init__(self) -> None:
        self.num_decoded_tokens = 0

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        self.num_decoded_tokens += len(token_ids)
        data = bytes(t for t in token_ids if t != SPECIAL)
        return data.decode("utf-8", errors="replace")


def byte_tokens(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def feed(detok: IncrementalDetokenizer, token_ids: list[int]) -> str | None:
    for token in token_ids:
        matched = detok.update([token])
        if matched is not None:
            return matched
    return detok.finish()


@pytest.mark.parametrize("seed", range(20))
def test_text_equals_a_full_decode(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = ["a", " ", "é", "日", "€", "\U0001f600", "z"]
    tokens = byte_tokens("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))))
    tokens = [t for t in tokens for t in ([t, SPECIAL] if rng.random() < 0.1 else [t])]
    if rng.random() < 0.5:
        tokens.append(0xE6)  # the first byte of a 3-byte character the sequence never completes
    detok = IncrementalDetokenizer(ByteDecoder(), ())
    assert feed(detok, tokens) is None
    assert detok.text == ByteDecoder().decode(tokens)


def test_incomplete_character_is_held_then_flushed_at_finish() -> None:
    detok = IncrementalDetokenizer(ByteDecoder(), ("zz",))
    detok.update(byte_tokens("ab"))
    detok.update([0xE6, 0x97])  # two of the three bytes of 日
    assert detok.text == "ab"
    assert detok.finish() is None
    assert detok.text == "ab\ufffd"  # what a full decode gives


def test_stop_string_across_a_split_multibyte_character() -> None:
    detok = IncrementalDetokenizer(ByteDecoder(), ("日本",))
    tokens = byte_tokens("x日本y")
    matched = None
    for i, token in enumerate(tokens):
        matched = detok.update([token])
        if matched is not None:
            assert i == len(byte_tokens("x日本")) - 1  # found by the last byte of 本
            break
    assert matched == "日本"
    assert detok.text == "x"
    assert detok.stop_string == "日本"
    assert detok.update(byte_tokens("more")) is None and detok.text == "x"


def test_stop_string_in_the_flushed_text() -> None:
    detok = IncrementalDetokenizer(ByteDecoder(), ("a\ufffd",))
    detok.update(byte_tokens("ba"))
    detok.update([0xE6])
    assert detok.finish() == "a\ufffd"
    assert detok.text == "b"


def test_earliest_stop_string_wins_and_text_is_cut_before_it() -> None:
    detok = IncrementalDetokenizer(ByteDecoder(), ("cd", "bcde"))
    assert feed(detok, byte_tokens("abcdef")) == "cd"
    assert detok.text == "ab"
    detok = IncrementalDetokenizer(ByteDecoder(), ("bcd", "cd"))
    assert feed(detok, byte_tokens("abcdef")) == "bcd"
    assert detok.text == "a"


def test_cost_per_token_does_not_grow() -> None:
    # 20,000 tokens: characters of 1-4 bytes and runs of special tokens that decode to nothing.
    rng = random.Random(0)
    tokens: list[int] = []
    while len(tokens) < 20_000:
        tokens += byte_tokens(rng.choice(["a", "é", "日", "\U0001f600"])) if rng.random() < 0.9 else [SPECIAL] * 50
    decoder = ByteDecoder()
    detok = IncrementalDetokenizer(decoder, ("never",))
    assert feed(detok, tokens) is None
    assert detok.text == ByteDecoder().decode(tokens)
    assert decoder.num_decoded_tokens < 40 * len(tokens)


def test_real_tokenizer_split_character_and_stop_across_it() -> None:
    tokenizer = smollm2_tokenizer()
    left, right = 23274, 115  # the two tokens of 日 (each decodes alone to U+FFFD)
    assert tokenizer.decode([left]) == "\ufffd" and tokenizer.decode([left, right]) == "日"
    tokens = [*tokenizer.encode("ab", add_special_tokens=False), left, right]
    tokens += tokenizer.encode("本 cd", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, ("never",))
    assert feed(detok, tokens) is None
    assert detok.text == tokenizer.decode(tokens) == "ab日本 cd"
    detok = IncrementalDetokenizer(tokenizer, ("b日",))
    texts = []
    for token in tokens:
        matched = detok.update([token])
        texts.append(detok.text)
        if matched is not None:
            break
    assert matched == "b日" and detok.text == "a"
    assert texts[-2] == "ab"  # while 日 was half-decoded, nothing of it showed
