"""Measure llguidance and xgrammar on this machine with the built-in model's tokenizer (issue 22).

For each library that imports: the tokenizer setup time, the grammar compile time of a few
typical schemas, a regex and a choice, and the mask time per decode step at batch 64 (64 rows,
each walking the tokens of a valid answer to its schema, a bitmask filled for all 64 rows per
step), plus the cost of applying the 64 bitmasks to float32 logits [64, 49152] in torch.

    python jobs/bench/grammar_libraries.py [--threads 1] [--steps 40] [--json out.json]

The libraries are optional here: a missing one is reported and skipped. Install them in a
scratch folder and put it on PYTHONPATH to compare (`pip install --target /tmp/x xgrammar`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

SCHEMAS: dict[str, dict[str, Any]] = {
    "label": {
        "type": "object",
        "properties": {"label": {"enum": ["positive", "negative", "neutral"]}},
        "required": ["label"],
        "additionalProperties": False,
    },
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
            },
            "score": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}]},
            "kind": {"const": "record"},
        },
        "required": ["id", "tags", "address", "kind"],
        "additionalProperties": False,
    },
}
ANSWERS: dict[str, str] = {
    "label": '{"label": "negative"}',
    "person": '{"name": "Ada Lovelace", "age": 36, "email": "ada@math.com"}',
    "nested": '{"id": 17, "tags": ["a", "bb", "ccc"], "address": {"city": "Paris", "zip": "75001"}, '
    '"score": 0.25, "kind": "record"}',
}
REGEX = r"\d{3}-\d{3}-\d{4}"
REGEX_ANSWER = "555-123-4567"
CHOICES = ["positive", "negative", "neutral"]


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _tokenizer() -> Any:
    import gguf

    from batchgen.models.checkpoint import default_model_path
    from batchgen.tokenizer.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf.GGUFReader(default_model_path()))


def _answer_tokens(tok: Any) -> dict[str, list[int]]:
    out = {name: tok.encode(text, add_special_tokens=False) for name, text in ANSWERS.items()}
    out["regex"] = tok.encode(REGEX_ANSWER, add_special_tokens=False)
    out["choice"] = tok.encode("neutral", add_special_tokens=False)
    return out


def measure_llguidance(tok: Any, threads: int, steps: int) -> dict[str, Any]:
    import llguidance
    import llguidance.torch as llt

    result: dict[str, Any] = {"version": llguidance.__version__}
    eos = tok.eos_token_id
    t = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size, eos_token=eos)
    result["tokenizer_setup_s"] = time.perf_counter() - t
    grammars = {name: llguidance.LLMatcher.grammar_from_json_schema(s) for name, s in SCHEMAS.items()}
    grammars["regex"] = llguidance.LLMatcher.grammar_from_regex(REGEX)
    choice_lark = "start: " + " | ".join(json.dumps(c) for c in CHOICES)
    grammars["choice"] = llguidance.LLMatcher.grammar_from_lark(choice_lark)
    mask = llt.allocate_token_bitmask(1, tok.vocab_size)
    compile_s = {}
    for name, grammar in grammars.items():

        def build(g: str = grammar) -> None:
            m = llguidance.LLMatcher(lltok, g)
            assert not m.is_error(), m.get_error()
            llt.fill_next_token_bitmask(m, mask)  # the lexer is built lazily: count the first mask

        compile_s[name] = _median_s(build, 5)
    result["compile_first_mask_s"] = compile_s
    executor = llguidance.LLExecutor(num_threads=threads)
    answers = _answer_tokens(tok)
    names = list(grammars)
    rows = [names[i % len(names)] for i in range(64)]
    templates = {name: llguidance.LLMatcher(lltok, g) for name, g in grammars.items()}
    per_step: list[float] = []
    bitmask = llt.allocate_token_bitmask(64, tok.vocab_size)
    for _ in range(max(1, steps // 10)):
        matchers = [templates[n].deep_copy() for n in rows]
        pos = [0] * 64
        for _step in range(10):
            live = [(m, i) for i, m in enumerate(matchers) if pos[i] < len(answers[rows[i]])]
            if not live:
                break
            t = time.perf_counter()
            llt.fill_next_token_bitmask_par(executor, live, bitmask)
            per_step.append(time.perf_counter() - t)
            for m, i in live:
                token = answers[rows[i]][pos[i]]
                assert (int(bitmask[i, token // 32]) >> (token % 32)) & 1, (rows[i], pos[i])
                assert m.consume_token(token), m.get_error()
                pos[i] += 1
    result["mask_batch64_step_ms_median"] = 1e3 * statistics.median(per_step)
    result["allowed_tokens_last_step_mean"] = _mean_allowed(bitmask)
    result["mask_batch64_step_ms_p90"] = 1e3 * sorted(per_step)[int(0.9 * len(per_step))]
    logits = torch.randn(64, tok.vocab_size)
    result["apply_batch64_ms"] = 1e3 * _median_s(lambda: _apply_bitmask(logits.clone(), bitmask), 20)
    return result


def measure_xgrammar(tok: Any, threads: int, steps: int) -> dict[str, Any]:
    t = time.perf_counter()
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    result: dict[str, Any] = {"import_s": time.perf_counter() - t}
    t = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend, eos_token=tok.eos_token)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=tok.vocab_size, stop_token_ids=[tok.eos_token_id])
    result["tokenizer_setup_s"] = time.perf_counter() - t
    compile_s = {}
    mask = xgr.allocate_token_bitmask(1, tok.vocab_size)

    def compile_all(compiler: Any) -> dict[str, Any]:
        out = {name: compiler.compile_json_schema(json.dumps(s)) for name, s in SCHEMAS.items()}
        out["regex"] = compiler.compile_regex(REGEX)
        choice = "root ::= " + " | ".join(json.dumps(c) for c in CHOICES)
        out["choice"] = compiler.compile_grammar(choice)
        return out

    for name in [*SCHEMAS, "regex", "choice"]:

        def build(n: str = name) -> None:
            compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
            if n in SCHEMAS:
                g = compiler.compile_json_schema(json.dumps(SCHEMAS[n]))
            elif n == "regex":
                g = compiler.compile_regex(REGEX)
            else:
                g = compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in CHOICES))
            xgr.GrammarMatcher(g).fill_next_token_bitmask(mask, 0)

        compile_s[name] = _median_s(build, 3)
    result["compile_first_mask_s"] = compile_s
    compiled = compile_all(xgr.GrammarCompiler(info, max_threads=threads))
    answers = _answer_tokens(tok)
    names = list(compiled)
    rows = [names[i % len(names)] for i in range(64)]
    per_step: list[float] = []
    bitmask = xgr.allocate_token_bitmask(64, tok.vocab_size)
    batch = xgr.BatchGrammarMatcher(max_threads=threads)
    for _ in range(max(1, steps // 10)):
        matchers = [xgr.GrammarMatcher(compiled[n]) for n in rows]
        pos = [0] * 64
        for _step in range(10):
            live = [i for i in range(64) if pos[i] < len(answers[rows[i]])]
            if not live:
                break
            t = time.perf_counter()
            batch.batch_fill_next_token_bitmask([matchers[i] for i in live], bitmask, live)
            per_step.append(time.perf_counter() - t)
            for i in live:
                token = answers[rows[i]][pos[i]]
                assert (int(bitmask[i, token // 32]) >> (token % 32)) & 1, (rows[i], pos[i])
                assert matchers[i].accept_token(token)
                pos[i] += 1
    result["mask_batch64_step_ms_median"] = 1e3 * statistics.median(per_step)
    result["allowed_tokens_last_step_mean"] = _mean_allowed(bitmask)
    result["mask_batch64_step_ms_p90"] = 1e3 * sorted(per_step)[int(0.9 * len(per_step))]
    logits = torch.randn(64, tok.vocab_size)
    result["apply_batch64_ms"] = 1e3 * _median_s(lambda: _apply_bitmask(logits.clone(), bitmask), 20)
    return result


def _mean_allowed(bitmask: torch.Tensor) -> float:
    """Mean number of allowed tokens per row of the last mask (a sanity figure: a mask that
    allows everything would pass the walk's checks)."""
    bits = torch.arange(32, dtype=torch.int32)
    return float(((bitmask[:, :, None] >> bits) & 1).sum(dim=(1, 2)).float().mean())


def _apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """The engine's own unpack-and-fill (both libraries' bitmask layout: bit j of word w is
    token 32 w + j)."""
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask[:, :, None] >> bits) & 1).bool().reshape(bitmask.shape[0], -1)
    logits.masked_fill_(~allowed[:, : logits.shape[1]], float("-inf"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", default=None)
    parser.add_argument("--only", choices=["llguidance", "xgrammar"], default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok = _tokenizer()
    report: dict[str, Any] = {"vocab_size": tok.vocab_size, "threads": args.threads}
    for name, fn in (("llguidance", measure_llguidance), ("xgrammar", measure_xgrammar)):
        if args.only not in (None, name):
            continue
        try:
            report[name] = fn(tok, args.threads, args.steps)
        except ImportError as exc:
            report[name] = {"missing": str(exc)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
