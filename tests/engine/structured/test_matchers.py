"""GrammarMatchers: masks along a walk, EOS only where the grammar accepts, state rebuilt from
tokens, and random walks (any allowed token, seeded) whose finished outputs always match: JSON
that validates against its schema (jsonschema), a regex's full match, one of the choices."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from batchgen.engine.structured.grammar import (
    GrammarCompiler,
    GrammarTokenizer,
    StructuredOutputError,
)
from batchgen.engine.structured.mask import unpack_bitmask
from batchgen.engine.structured.matchers import GrammarMatchers, GrammarTarget
from batchgen.engine.structured.params import StructuredOutputsParams
from batchgen.tokenizer.tokenizer import Tokenizer
from tests.engine.structured.conftest import EOS

PROMPT = [1, 2, 3]

# Bounded outputs (maxLength, maxItems, no extra properties), so a random walk ends.
WALK_SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1, "maxItems": 3},
            "kind": {"enum": ["a", "b", 3]},
            "score": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}]},
            "c": {"const": "x"},
        },
        "required": ["id", "tags", "kind", "c"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6}, "floor": {"type": "integer", "exclusiveMinimum": -3, "maximum": 40}},
                "required": ["city", "floor"],
                "additionalProperties": False,
            },
            "ok": {"type": "boolean"},
        },
        "required": ["zip", "address", "ok"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 2, "maxItems": 4},
]
WALK_REGEXES = [
    r"\d{3}-\d{4}",
    r"(cat|dog)s?",
    r"[a-z]{2,5}@[a-z]{3}\.(com|org)",
    r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?",
]


def _allowed(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return unpack_bitmask(bitmask_row[None, :], vocab_size)[0].nonzero().flatten()


def _walk(
    grammar_tokenizer: GrammarTokenizer, compiler: GrammarCompiler, params: StructuredOutputsParams, seed: int, max_steps: int
) -> tuple[list[int], bool]:
    """Draw uniformly among the allowed tokens (EOS, where allowed, with probability 1/2) until
    the grammar completes, EOS is drawn or max_steps pass. Returns the generated tokens and
    whether the output is a complete match."""
    rng = random.Random(seed)
    matchers = GrammarMatchers(grammar_tokenizer, num_threads=1)
    matchers.add(0, compiler.compile(params))
    tokens = list(PROMPT)
    for _ in range(max_steps):
        allowed = _allowed(matchers.fill_bitmask([GrammarTarget(0, tokens, len(PROMPT))])[0], grammar_tokenizer.vocab_size)
        ids = allowed.tolist()
        eos_allowed = EOS in ids
        assert eos_allowed == matchers.is_accepting(0)  # EOS exactly where the grammar accepts
        if eos_allowed and (len(ids) == 1 or rng.random() < 0.5):
            return tokens[len(PROMPT) :], True
        others = [t for t in ids if t != EOS]
        token = others[rng.randrange(len(others))]
        assert matchers.advance(0, token)
        tokens.append(token)
        if matchers.is_complete(0):
            return tokens[len(PROMPT) :], True
    return tokens[len(PROMPT) :], False


@pytest.mark.parametrize("schema", WALK_SCHEMAS, ids=["nested", "pattern-range", "array"])
def test_random_walks_give_valid_json(
    schema: dict[str, object], grammar_tokenizer: GrammarTokenizer, compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    params = StructuredOutputsParams(json=schema)
    completed = 0
    for seed in range(6):
        tokens, done = _walk(grammar_tokenizer, compiler, params, seed, max_steps=120)
        if done:
            completed += 1
            jsonschema.validate(json.loads(tokenizer.decode(tokens)), schema)
    assert completed >= 5


@pytest.mark.parametrize("pattern", WALK_REGEXES)
def test_random_walks_full_match_the_regex(
    pattern: str, grammar_tokenizer: GrammarTokenizer, compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    params = StructuredOutputsParams(regex=pattern)
    for seed in range(6):
        tokens, done = _walk(grammar_tokenizer, compiler, params, seed, max_steps=40)
        assert done
        assert re.fullmatch(pattern, tokenizer.decode(tokens)), tokenizer.decode(tokens)


_choice_text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(["\"", "\\", "\n", "\t", "é", "日", " "]),
    min_size=1,
    max_size=6,
)


@settings(max_examples=25)
@given(choices=st.lists(_choice_text, min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_random_walks_end_on_one_of_the_choices(
    choices: list[str], seed: int, grammar_tokenizer: GrammarTokenizer, tokenizer: Tokenizer
) -> None:
    """The class behind choice: any strings (quotes, backslashes, control characters, non-ASCII,
    one a prefix of another) are matched exactly, never an escape of them."""
    assume(all(tokenizer.decode(tokenizer.encode(c, add_special_tokens=False), skip_special_tokens=False) == c for c in choices))
    compiler = GrammarCompiler(grammar_tokenizer)
    tokens, done = _walk(grammar_tokenizer, compiler, StructuredOutputsParams(choice=choices), seed, max_steps=60)
    assert done
    assert tokenizer.decode(tokens, skip_special_tokens=False) in choices


def test_a_choice_the_vocabulary_cannot_write_is_rejected(compiler: GrammarCompiler) -> None:
    """SmolLM2 has no token for the byte 0xF1, so U+40000 (F1 80 80 80) cannot be generated;
    the mask offered 0x80 toward it and the matcher refused it (found by the walk above)."""
    with pytest.raises(StructuredOutputError, match="cannot be written with this model's vocabulary"):
        compiler.compile(StructuredOutputsParams(choice=["ok", "\U00040000"]))
    assert compiler.compile(StructuredOutputsParams(choice=["ok", "\U0001F600"])).kind == "choice"


def test_eos_only_at_the_end_and_complete_after_the_last_token(
    grammar_tokenizer: GrammarTokenizer, compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    answer = tokenizer.encode('{"n": 42}', add_special_tokens=False)
    matchers = GrammarMatchers(grammar_tokenizer, num_threads=1)
    matchers.add(5, compiler.compile(StructuredOutputsParams(json=schema)))
    tokens = list(PROMPT)
    for token in answer:
        allowed = _allowed(matchers.fill_bitmask([GrammarTarget(5, tokens, len(PROMPT))])[0], grammar_tokenizer.vocab_size)
        assert token in allowed.tolist() and EOS not in allowed.tolist()
        assert not matchers.is_complete(5)
        assert matchers.advance(5, token)
        tokens.append(token)
    assert matchers.is_complete(5) and matchers.is_accepting(5)
    allowed = _allowed(matchers.fill_bitmask([GrammarTarget(5, tokens, len(PROMPT))])[0], grammar_tokenizer.vocab_size)
    assert allowed.tolist() == [EOS]
    assert (matchers.num_rebuilds, matchers.num_rejected) == (0, 0)


def test_rebuilt_from_tokens_when_they_disagree(
    grammar_tokenizer: GrammarTokenizer, compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    """A matcher that consumed other tokens than its sequence holds (a recompute, a lost step)
    is rebuilt from the sequence's generated tokens: the same mask as a fresh walk."""
    grammar = compiler.compile(StructuredOutputsParams(regex=r"[a-c]{1,3}-[0-9]{2}"))
    a, b, c, dash = (tokenizer.encode(x, add_special_tokens=False)[0] for x in ("a", "b", "c", "-"))
    fresh = GrammarMatchers(grammar_tokenizer, num_threads=1)
    fresh.add(0, grammar)
    expected = fresh.fill_bitmask([GrammarTarget(0, [*PROMPT, a, b], len(PROMPT))]).clone()
    assert fresh.num_rebuilds == 0  # a first fill builds, it does not rebuild

    matchers = GrammarMatchers(grammar_tokenizer, num_threads=1)
    matchers.add(1, grammar)
    matchers.fill_bitmask([GrammarTarget(1, list(PROMPT), len(PROMPT))])
    for token in (a, c, dash):
        assert matchers.advance(1, token)
    # fewer tokens than consumed
    assert torch.equal(matchers.fill_bitmask([GrammarTarget(1, [*PROMPT, a, b], len(PROMPT))]), expected)
    assert matchers.num_rebuilds == 1
    # as many tokens, another last one
    assert matchers.advance(1, c)  # the matcher now holds a b c; the sequence says a b a
    seq = [*PROMPT, a, b, a]
    rebuilt = matchers.fill_bitmask([GrammarTarget(1, seq, len(PROMPT))]).clone()
    assert matchers.num_rebuilds == 2
    fresh.add(2, grammar)
    assert torch.equal(rebuilt, fresh.fill_bitmask([GrammarTarget(2, seq, len(PROMPT))]))


def test_a_refused_token_is_counted_and_leaves_only_eos(
    grammar_tokenizer: GrammarTokenizer, compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    matchers = GrammarMatchers(grammar_tokenizer, num_threads=1)
    matchers.add(3, compiler.compile(StructuredOutputsParams(choice=["yes"])))
    matchers.fill_bitmask([GrammarTarget(3, list(PROMPT), len(PROMPT))])
    assert not matchers.advance(3, tokenizer.encode("no", add_special_tokens=False)[0])
    assert matchers.num_rejected == 1 and matchers.is_complete(3) and not matchers.is_accepting(3)
    allowed = _allowed(matchers.fill_bitmask([GrammarTarget(3, [*PROMPT, 0], len(PROMPT))])[0], grammar_tokenizer.vocab_size)
    assert allowed.tolist() == [EOS]


def test_many_rows_in_one_fill(grammar_tokenizer: GrammarTokenizer, compiler: GrammarCompiler) -> None:
    """64 rows of mixed grammars in one parallel fill equal each row filled alone; the buffer
    grows and is reused."""
    kinds = [
        StructuredOutputsParams(json=WALK_SCHEMAS[0]),
        StructuredOutputsParams(regex=WALK_REGEXES[0]),
        StructuredOutputsParams(choice=["positive", "negative"]),
        StructuredOutputsParams(json_object=True),
    ]
    together = GrammarMatchers(grammar_tokenizer, num_threads=2)
    alone = GrammarMatchers(grammar_tokenizer, num_threads=1)
    targets = []
    for i in range(64):
        grammar = compiler.compile(kinds[i % 4])
        together.add(i, grammar)
        alone.add(i, grammar)
        targets.append(GrammarTarget(i, list(PROMPT), len(PROMPT)))
    batch = together.fill_bitmask(targets).clone()
    assert batch.shape == (64, (grammar_tokenizer.vocab_size + 31) // 32)
    for i, target in enumerate(targets):
        assert torch.equal(batch[i], alone.fill_bitmask([target])[0])
    assert len(together) == 64 and 63 in together
    together.release(63)
    assert 63 not in together
    with pytest.raises(ValueError, match="already has"):
        together.add(0, compiler.compile(kinds[0]))
