"""Structured output: a request's output constrained to a JSON schema, a regex, a choice of
strings or a grammar, by masking at each step the tokens its grammar forbids.

    params.py    StructuredOutputsParams (vLLM's names; pure Python)
    grammar.py   the grammar engine (llguidance): tokenizer adapter, compile cache, errors
    matchers.py  GrammarMatchers: per-sequence matcher state, one owner keyed by seq_id
    mask.py      bitmask -> logits mask, the sampler's grammar slot

Part of the engine layer. May import: torch, llguidance (lazily), batchgen.tokenizer. Never
batchgen.job, batchgen.io.
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = [
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarMatchers",
    "GrammarTarget",
    "GrammarTokenizer",
    "StructuredOutputError",
    "StructuredOutputsParams",
    "apply_grammar_mask",
    "unpack_bitmask",
]

__getattr__ = lazy_getattr(
    __name__,
    {
        "StructuredOutputsParams": "params",
        "CompiledGrammar": "grammar",
        "GrammarCompiler": "grammar",
        "GrammarTokenizer": "grammar",
        "StructuredOutputError": "grammar",
        "GrammarMatchers": "matchers",
        "GrammarTarget": "matchers",
        "apply_grammar_mask": "mask",
        "unpack_bitmask": "mask",
    },
)
