"""The grammar engine adapter: compile cache by canonical text, rejections with the library's
reason, GBNF, and the tokenizer adapter giving the same masks from a GGUF and a HF folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from batchgen.engine.structured.grammar import (
    GrammarCompiler,
    GrammarTokenizer,
    StructuredOutputError,
)
from batchgen.engine.structured.matchers import GrammarMatchers, GrammarTarget
from batchgen.engine.structured.params import StructuredOutputsParams
from batchgen.tokenizer.tokenizer import Tokenizer
from tests.engine.structured.conftest import EOS

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_cache_by_canonical_text(compiler: GrammarCompiler) -> None:
    first = compiler.compile(StructuredOutputsParams(json=PERSON))
    again = compiler.compile(StructuredOutputsParams(json=json.dumps(PERSON, indent=2)))
    assert again is first
    assert (compiler.num_compiled, compiler.num_cache_hits, len(compiler)) == (1, 1, 1)
    assert first.kind == "json" and first.canonical_text == StructuredOutputsParams(json=PERSON).canonical_text
    # two matchers from one compiled grammar are independent
    a, b = first.new_matcher(), first.new_matcher()
    assert a.consume_token(39428)  # '{"'
    assert not a.is_accepting() and b.validate_tokens([39428]) == 1


def test_cache_is_lru_bounded(grammar_tokenizer: GrammarTokenizer) -> None:
    compiler = GrammarCompiler(grammar_tokenizer, max_entries=2)
    a, b, c = (StructuredOutputsParams(choice=[x]) for x in "abc")
    compiler.compile(a)
    compiler.compile(b)
    compiler.compile(a)  # a is now the most recent
    compiler.compile(c)  # evicts b
    assert (compiler.num_compiled, len(compiler)) == (3, 2)
    compiler.compile(a)
    assert compiler.num_compiled == 3
    compiler.compile(b)
    assert compiler.num_compiled == 4
    with pytest.raises(ValueError, match="max_entries"):
        GrammarCompiler(grammar_tokenizer, max_entries=0)


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"json": {"type": "strnig"}}, "structured_outputs.json: Invalid type: strnig"),
        ({"json": {"type": "array", "uniqueItems": True}}, "Unimplemented keys"),
        ({"json": {"type": "string", "pattern": "(?=a)b"}}, "look-around"),
        ({"json": {"$ref": "#/definitions/missing"}}, "does not exist"),
        ({"regex": "(ab"}, "structured_outputs.regex: .*unclosed group"),
        ({"grammar": "start: missing_rule"}, "structured_outputs.grammar: .*unknown name"),
        ({"grammar": "root ::= (unclosed"}, "structured_outputs.grammar"),
    ],
)
def test_rejections_name_the_reason_and_are_cached(
    compiler: GrammarCompiler, values: dict[str, object], reason: str
) -> None:
    params = StructuredOutputsParams.from_mapping(values)
    for _ in range(2):
        with pytest.raises(StructuredOutputError, match=reason):
            compiler.compile(params)
    assert (compiler.num_compiled, compiler.num_cache_hits) == (1, 1)
    assert issubclass(StructuredOutputError, ValueError)


def _walk(tokenizer: GrammarTokenizer, compiled: StructuredOutputsParams, compiler: GrammarCompiler, tokens: list[int]) -> list[torch.Tensor]:
    """The bitmask before each token and after the last, walking `tokens` (each must be allowed)."""
    matchers = GrammarMatchers(tokenizer, num_threads=1)
    matchers.add(0, compiler.compile(compiled))
    masks = []
    prompt = [1]
    for i in range(len(tokens) + 1):
        bitmask = matchers.fill_bitmask([GrammarTarget(0, prompt + tokens[:i], 1)]).clone()
        masks.append(bitmask[0])
        if i < len(tokens):
            assert (int(bitmask[0, tokens[i] // 32]) >> (tokens[i] % 32)) & 1
            assert matchers.advance(0, tokens[i])
    assert matchers.is_complete(0) and matchers.is_accepting(0)
    return masks


def test_gbnf_grammar_is_converted(compiler: GrammarCompiler, grammar_tokenizer: GrammarTokenizer, tokenizer: Tokenizer) -> None:
    params = StructuredOutputsParams(grammar='root ::= "yes" | "no" | "maybe " [0-9]')
    masks = _walk(grammar_tokenizer, params, compiler, tokenizer.encode("maybe 7", add_special_tokens=False))
    last = masks[-1]
    assert [t for t in range(32 * last.shape[0]) if (int(last[t // 32]) >> (t % 32)) & 1] == [EOS]


def test_tokenizer_adapter_gguf_and_hf_folder_give_the_same_masks(
    tmp_path: Path, tokenizer: Tokenizer, grammar_tokenizer: GrammarTokenizer
) -> None:
    """The same tokenizer read from the GGUF and from a Hugging Face folder written from it:
    identical masks at every step of a JSON answer."""
    tokenizer.save_pretrained(tmp_path)
    from_folder = Tokenizer.from_hf_folder(tmp_path)
    folder_view = GrammarTokenizer(from_folder, vocab_size=from_folder.vocab_size, eos_token_ids=[EOS])
    params = StructuredOutputsParams(json=PERSON)
    tokens = tokenizer.encode('{"name": "Zoé", "age": 41}', add_special_tokens=False)
    assert from_folder.encode('{"name": "Zoé", "age": 41}', add_special_tokens=False) == tokens
    from_gguf = _walk(grammar_tokenizer, params, GrammarCompiler(grammar_tokenizer), tokens)
    from_hf = _walk(folder_view, params, GrammarCompiler(folder_view), tokens)
    assert len(from_gguf) == len(tokens) + 1
    for a, b in zip(from_gguf, from_hf, strict=True):
        assert torch.equal(a, b)


def test_vocab_wider_than_the_tokenizer(tokenizer: Tokenizer) -> None:
    """A model whose logits are wider than its tokenizer (padded vocabularies): the extra ids
    are never allowed."""
    wide = GrammarTokenizer(tokenizer, vocab_size=tokenizer.vocab_size + 64, eos_token_ids=[EOS])
    assert wide.vocab_size == tokenizer.vocab_size + 64
    matchers = GrammarMatchers(wide, num_threads=1)
    matchers.add(7, GrammarCompiler(wide).compile(StructuredOutputsParams(json_object=True)))
    bitmask = matchers.fill_bitmask([GrammarTarget(7, [1], 1)])
    assert bitmask.shape == (1, (tokenizer.vocab_size + 64 + 31) // 32)
    assert torch.all(bitmask[0, tokenizer.vocab_size // 32 :] == 0)


def test_no_eos_is_an_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(StructuredOutputError, match="EOS"):
        GrammarTokenizer(tokenizer, vocab_size=tokenizer.vocab_size, eos_token_ids=[])


def test_properties_come_in_the_schemas_order(compiler: GrammarCompiler, tokenizer: Tokenizer) -> None:
    """The grammar engine writes properties in the order the schema lists them (a sorted cache
    key once sent it "age" before "name"): the order the user wrote is kept."""
    schema = {"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}}, "required": ["zeta", "alpha"]}
    for written in (schema, json.dumps(schema)):
        matcher = compiler.compile(StructuredOutputsParams(json=written)).new_matcher()
        assert matcher.consume_tokens(tokenizer.encode('{"zeta": 1, "alpha": 2}', add_special_tokens=False))
        assert matcher.is_accepting()
        other = compiler.compile(StructuredOutputsParams(json=written)).new_matcher()
        assert not other.consume_tokens(tokenizer.encode('{"alpha": 2, "zeta": 1}', add_special_tokens=False))
