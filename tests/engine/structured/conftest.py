"""Shared fixtures: llguidance's view of the built-in model's tokenizer (49,152 tokens, from the
packaged GGUF), built once per session (about a second)."""

from __future__ import annotations

import pytest

from batchgen.engine.structured.grammar import GrammarCompiler, GrammarTokenizer
from batchgen.tokenizer.tokenizer import Tokenizer
from tests.tiny_models import smollm2_tokenizer

EOS = 2  # SmolLM2's <|im_end|>


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def grammar_tokenizer(tokenizer: Tokenizer) -> GrammarTokenizer:
    return GrammarTokenizer(tokenizer, vocab_size=tokenizer.vocab_size, eos_token_ids=[EOS])


@pytest.fixture
def compiler(grammar_tokenizer: GrammarTokenizer) -> GrammarCompiler:
    return GrammarCompiler(grammar_tokenizer)
