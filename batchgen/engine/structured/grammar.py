"""The grammar engine behind structured output: llguidance, its view of the tokenizer, and a
compile cache keyed by canonical text.

llguidance was chosen by measurement on the project's machine with the built-in model's 49,152
token vocabulary (jobs/bench/grammar_libraries.py, figures in the issue 22 note): it compiles a
JSON schema in about a millisecond (xgrammar: 17-90 ms), so that every row of a job may carry
its own schema; it has no dependencies (xgrammar needs transformers, pydantic and apache-tvm-ffi
at run time) and one abi3 wheel for every Python; its masks cost about 1 ms per batch-64 step
(median; xgrammar's 0.2 ms), computed while the forward pass runs.

`GrammarTokenizer` adapts a `batchgen.tokenizer.Tokenizer` (from a Hugging Face folder or a
GGUF file alike: both wrap a `tokenizers` backend, whose JSON llguidance reads) with the
model's vocabulary size (the logits' width) and EOS ids. Building it costs about a second, so
an engine builds it at its first constrained request only.

`GrammarCompiler.compile` turns a `StructuredOutputsParams` into a `CompiledGrammar` (a matcher
in its start state; each row gets a copy, about 2 us) or raises `StructuredOutputError` with the
library's reason. Results, rejections included, are cached by `canonical_text` (LRU, bounded),
because a job's rows repeat the same few schemas. Not thread-safe: the engine's thread owns it.

May import: llguidance (lazily: importing this module does not need it), batchgen.tokenizer,
batchgen.engine.structured.params. No torch.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Collection
from typing import TYPE_CHECKING

from batchgen.engine.structured.params import StructuredOutputsParams
from batchgen.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:
    import llguidance
    from llguidance._lib import JsonCompileOptions

__all__ = [
    "JSON_LAYOUT",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarTokenizer",
    "StructuredOutputError",
    "grammar_spec",
]

DEFAULT_CACHE_ENTRIES = 1024
# JSON is written as Python's json.dumps writes it: '{"a": 1, "b": [2, 3]}'. With llguidance's
# default (any whitespace between tokens) a model, or a random walk, can loop on newlines and
# spaces until max_tokens; one fixed layout rules that out. A schema's own "x-guidance" key
# overrides it (llguidance applies these defaults first).
JSON_LAYOUT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_MAX_REASON_CHARS = 500


class StructuredOutputError(ValueError):
    """A structured-output constraint that cannot be used: the grammar engine rejects the
    schema, regex or grammar (the message gives its reason), or cannot read the tokenizer."""


def _reason(text: str) -> str:
    """The library's message on one line (an error row's message, an exit-2 line), capped."""
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + "..."


def _require_llguidance() -> None:
    """Raises StructuredOutputError when llguidance is not installed (a required dependency,
    imported only once a request asks for structured output)."""
    try:
        import llguidance  # noqa: F401
    except ImportError as exc:
        raise StructuredOutputError(
            "structured output needs the Python package llguidance (pip install llguidance)"
        ) from exc


class GrammarTokenizer:
    """llguidance's tokenizer for one model. `vocab_size`: the width of the model's logits
    (tokens the tokenizer lacks are never allowed); `eos_token_ids`: what ends a row, allowed
    exactly where the grammar accepts. Immutable; safe to share between threads.

    Raises StructuredOutputError when llguidance cannot read the tokenizer."""

    __slots__ = ("eos_token_ids", "ll_tokenizer", "vocab_size")

    def __init__(self, tokenizer: Tokenizer, *, vocab_size: int, eos_token_ids: Collection[int]) -> None:
        _require_llguidance()
        import llguidance

        if not eos_token_ids:
            raise StructuredOutputError("structured output needs the model's EOS token id; none is known")
        self.vocab_size = max(vocab_size, tokenizer.vocab_size)
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        try:
            self.ll_tokenizer: llguidance.LLTokenizer = llguidance.LLTokenizer(
                tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids)
            )
        except (ValueError, RuntimeError) as exc:
            raise StructuredOutputError(
                f"the grammar engine cannot read this model's tokenizer: {_reason(str(exc))}"
            ) from exc


def grammar_spec(params: StructuredOutputsParams) -> str:
    """llguidance's grammar text for a constraint (not yet checked against a tokenizer).
    Raises StructuredOutputError for a GBNF grammar that cannot be converted."""
    _require_llguidance()
    import llguidance
    from llguidance.gbnf_to_lark import gbnf_to_lark

    matcher = llguidance.LLMatcher
    kind = params.kind
    if kind == "json":
        return matcher.grammar_from_json_schema(json.dumps(params.schema, ensure_ascii=False), defaults=JSON_LAYOUT)
    if kind == "json_object":
        return matcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_LAYOUT)
    if kind == "regex":
        return matcher.grammar_from_regex(str(params.regex))
    if kind == "choice":
        # Lark string literals take JSON's escapes; ensure_ascii=False keeps non-ASCII as text.
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in params.choice or ())
        return matcher.grammar_from_lark(f"start: {alternatives}")
    text = str(params.grammar)
    if "::=" in text:  # GBNF (llama.cpp's and xgrammar's EBNF form), vLLM's rule of thumb
        try:
            text = gbnf_to_lark(text)
        except Exception as exc:  # the converter raises plain exceptions on malformed input
            raise StructuredOutputError(f"structured_outputs.grammar: not a valid GBNF grammar: {_reason(str(exc))}") from exc
    return matcher.grammar_from_lark(text)


class CompiledGrammar:
    """A checked grammar: `new_matcher()` gives a matcher in its start state. `warnings`: what
    the library noted but accepted."""

    __slots__ = ("_template", "canonical_text", "kind", "warnings")

    def __init__(self, template: llguidance.LLMatcher, kind: str, canonical_text: str, warnings: tuple[str, ...]) -> None:
        self._template = template
        self.kind = kind
        self.canonical_text = canonical_text
        self.warnings = warnings

    def new_matcher(self) -> llguidance.LLMatcher:
        """A fresh matcher (a copy of the start state, so no compile work is repeated)."""
        return self._template.deep_copy()


class GrammarCompiler:
    """Compiles constraints for one tokenizer, caching results by canonical text (at most
    `max_entries`, least recently used dropped). Counts in `num_compiled`, `num_cache_hits`."""

    def __init__(self, tokenizer: GrammarTokenizer, *, max_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.tokenizer = tokenizer
        self._max_entries = max_entries
        self._cache: OrderedDict[str, CompiledGrammar | StructuredOutputError] = OrderedDict()
        self.num_compiled = 0
        self.num_cache_hits = 0

    def __len__(self) -> int:
        return len(self._cache)

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """The compiled grammar of `params`. Raises StructuredOutputError naming the kind and
        the library's reason when it rejects the constraint (the rejection is cached too)."""
        key = params.canonical_text
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
            self.num_cache_hits += 1
        else:
            found = self._compile(params, key)
            self.num_compiled += 1
            self._cache[key] = found
            if len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        if isinstance(found, StructuredOutputError):
            raise StructuredOutputError(str(found))
        return found

    def _compile(self, params: StructuredOutputsParams, key: str) -> CompiledGrammar | StructuredOutputError:
        import llguidance

        kind = params.kind
        try:
            spec = grammar_spec(params)
        except StructuredOutputError as exc:
            return exc
        except ValueError as exc:
            return StructuredOutputError(f"structured_outputs.{kind}: {_reason(str(exc))}")
        ll_tokenizer = self.tokenizer.ll_tokenizer
        for choice in params.choice or ():
            # A character without tokens for all its bytes cannot be generated; the mask would
            # still offer a token toward it, which the matcher then refuses.
            if ll_tokenizer.decode_bytes(ll_tokenizer.tokenize_str(choice)) != choice.encode("utf-8"):
                return StructuredOutputError(
                    f"structured_outputs.choice: {_reason(repr(choice))} cannot be written with this model's vocabulary"
                )
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(spec, ll_tokenizer)
        if is_error:
            reason = messages[0] if messages else "rejected by the grammar engine"
            return StructuredOutputError(f"structured_outputs.{kind}: {_reason(reason)}")
        template = llguidance.LLMatcher(ll_tokenizer, spec, log_level=0)
        if template.is_error():
            return StructuredOutputError(f"structured_outputs.{kind}: {_reason(template.get_error())}")
        return CompiledGrammar(template, kind, key, tuple(messages))

