"""Structured output through the engine (tiny random Llama with SmolLM2's 49k vocabulary):
every output that finished with "stop" matches its constraint (jsonschema validates the JSON,
regexes full-match, choices are members), greedy and seeded; under forced preemption; mixed with
unconstrained rows, which get the tokens they get alone; n samples; cut by max_tokens; the
grammar winning over a conflicting allowed_token_ids; rejections before anything is queued."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from batchgen import LLM, SamplingParams, StructuredOutputsParams
from batchgen.engine.outputs import RequestOutput
from batchgen.engine.structured.grammar import StructuredOutputError
from tests.tiny_models import make_tiny_hf_folder

SCHEMAS: dict[str, dict[str, object]] = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 12}, "id": {"type": "integer"}},
                "required": ["name", "id"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 2, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "enum": {"type": "object", "properties": {"label": {"enum": ["positive", "negative", "neutral"]}}, "required": ["label"]},
    "pattern": {
        "type": "object",
        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2}$"}},
        "required": ["zip", "code"],
        "additionalProperties": False,
    },
    "ranges": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 65},
            "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "n": {"type": "integer", "minimum": -3, "exclusiveMaximum": 3},
        },
        "required": ["age", "score", "n"],
        "additionalProperties": False,
    },
    "anyof-const": {
        "type": "object",
        "properties": {
            "kind": {"const": "event"},
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "maxLength": 4}, {"type": "null"}]},
        },
        "required": ["kind", "value"],
        "additionalProperties": False,
    },
    "open-object": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "maxProperties": 2},
}
REGEXES = [r"\d{3}-\d{3}-\d{4}", r"(yes|no)(, because [a-z ]{1,20})?", r"[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8}){0,2}"]
CHOICES = ["positive", "negative", "neutral", "not sure"]
PROMPTS = ["Answer in JSON:", "The weather today", "1 2 3", "Describe a user", "Label this review: great!"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def llm(folder: Path) -> LLM:
    return LLM(str(folder), seed=0)


def _check(output: RequestOutput, params: SamplingParams) -> None:
    """Every sample that finished with "stop" matches; one cut by length does not claim to."""
    structured = params.structured
    assert structured is not None
    for sample in output.outputs:
        assert sample.grammar_completed is (sample.finish_reason == "stop"), sample
        if sample.finish_reason != "stop":
            assert sample.finish_reason == "length" and len(sample.token_ids) == params.max_tokens
            continue
        if structured.kind == "json":
            jsonschema.validate(json.loads(sample.text), structured.schema or {})
        elif structured.kind == "json_object":
            assert isinstance(json.loads(sample.text), dict)
        elif structured.kind == "regex":
            assert re.fullmatch(str(structured.regex), sample.text), sample.text
        else:
            assert sample.text in (structured.choice or ())


def _suite(temperature: float, seed: int | None) -> list[SamplingParams]:
    kinds = [StructuredOutputsParams(json=s) for s in SCHEMAS.values()]
    kinds += [StructuredOutputsParams(regex=r) for r in REGEXES]
    kinds += [StructuredOutputsParams(choice=CHOICES), StructuredOutputsParams(json_object=True)]
    return [
        SamplingParams(max_tokens=80, temperature=temperature, seed=None if seed is None else seed + i, structured_outputs=k)
        for i, k in enumerate(kinds)
    ]


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (1.0, 7), (0.7, 1234)])
def test_every_stopped_output_matches(llm: LLM, temperature: float, seed: int | None) -> None:
    params = _suite(temperature, seed)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for out, p in zip(outputs, params, strict=True):
        _check(out, p)
    stopped = sum(o.outputs[0].finish_reason == "stop" for o in outputs)
    # A random tiny model wanders off in open objects (any extra property) until max_tokens;
    # the closed schemas, the regexes and the choice complete.
    assert stopped >= 9


def test_seeded_outputs_are_the_same_alone_in_a_batch_and_under_preemption(folder: Path) -> None:
    """A seeded constrained row draws the same tokens alone, beside other rows (constrained and
    not), and when the KV pool is so small that sequences are preempted and recomputed."""
    params = _suite(0.9, 50)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    plain = SamplingParams(max_tokens=30, temperature=0.9, seed=5, ignore_eos=True)
    alone = LLM(str(folder), seed=0)
    solo = [alone.generate([p], [sp], use_tqdm=False)[0].outputs[0].token_ids for p, sp in zip(prompts, params, strict=True)]
    batch = LLM(str(folder), seed=0)
    mixed = batch.generate([*prompts, "plain row"], [*params, plain], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:-1]] == solo
    small = LLM(str(folder), seed=0, block_size=4, num_kv_blocks=30, max_model_len=100, max_num_batched_tokens=16,
                admission_reserve_tokens=0)
    preempted = small.generate([*prompts, "plain row"], [*params, plain], use_tqdm=False)
    assert small.stats()["num_preemptions"] >= 3
    assert [o.outputs[0].token_ids for o in preempted] == [o.outputs[0].token_ids for o in mixed]
    for out, p in zip(preempted, params, strict=False):
        _check(out, p)


def test_unconstrained_rows_get_their_own_tokens_and_pay_nothing(folder: Path) -> None:
    prompts = ["alpha beta", "gamma", "delta epsilon zeta"]
    plain = [SamplingParams(max_tokens=12, temperature=0), SamplingParams(max_tokens=12, temperature=0.8, seed=9)]
    only_plain = LLM(str(folder), seed=0)
    expected = [o.outputs[0].token_ids for o in only_plain.generate(prompts[:2], plain, use_tqdm=False)]
    stats = only_plain.engine.structured.stats()
    assert (stats.num_masked_steps, stats.num_masked_rows, stats.num_compiled) == (0, 0, 0)
    mixed = LLM(str(folder), seed=0)
    constrained = SamplingParams(max_tokens=40, temperature=0, structured_outputs={"json": SCHEMAS["enum"]})
    outputs = mixed.generate(prompts, [*plain, constrained], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs[:2]] == expected
    assert all(o.outputs[0].grammar_completed is None for o in outputs[:2])
    _check(outputs[2], constrained)
    stats = mixed.engine.structured.stats()
    assert stats.num_masked_rows == len(outputs[2].outputs[0].token_ids)  # one row a step, its own


def test_n_samples_each_match(llm: LLM) -> None:
    params = SamplingParams(n=4, max_tokens=60, temperature=1.0, seed=3, structured_outputs={"json": SCHEMAS["nested"]})
    out = llm.generate(["Give a user as JSON"], params, use_tqdm=False)[0]
    assert len(out.outputs) == 4
    _check(out, params)
    assert len({o.text for o in out.outputs}) > 1


def test_cut_by_max_tokens_is_length_and_incomplete(llm: LLM) -> None:
    params = SamplingParams(max_tokens=3, temperature=0, structured_outputs={"json": SCHEMAS["nested"]})
    sample = llm.generate(["x"], params, use_tqdm=False)[0].outputs[0]
    assert (sample.finish_reason, sample.grammar_completed, len(sample.token_ids)) == ("length", False, 3)


def test_finishes_as_soon_as_the_grammar_completes(llm: LLM) -> None:
    """No EOS is needed once nothing else can follow: the row stops on its last token."""
    params = SamplingParams(max_tokens=20, temperature=0, structured_outputs={"choice": ["a long answer"]})
    sample = llm.generate(["x"], params, use_tqdm=False)[0].outputs[0]
    assert (sample.text, sample.finish_reason, sample.stop_reason, sample.grammar_completed) == (
        "a long answer",
        "stop",
        None,
        True,
    )
    assert llm.tokenizer.decode(list(sample.token_ids)) == "a long answer"


def test_a_grammar_completed_on_the_last_allowed_token_is_a_stop(llm: LLM) -> None:
    """The answer is whole when its grammar completes on the max_tokens-th token: `stop`, not
    `length` (it was `length` with grammar_completed True, and the summary counted it twice)."""
    needed = len(llm.generate(["x"], SamplingParams(max_tokens=20, temperature=0, structured_outputs={"choice": ["a long answer"]}),
                              use_tqdm=False)[0].outputs[0].token_ids)
    params = SamplingParams(max_tokens=needed, temperature=0, structured_outputs={"choice": ["a long answer"]})
    sample = llm.generate(["x"], params, use_tqdm=False)[0].outputs[0]
    assert (sample.text, sample.finish_reason, sample.grammar_completed, len(sample.token_ids)) == (
        "a long answer", "stop", True, needed
    )
    short = SamplingParams(max_tokens=needed - 1, temperature=0, structured_outputs={"choice": ["a long answer"]})
    cut = llm.generate(["x"], short, use_tqdm=False)[0].outputs[0]
    assert (cut.finish_reason, cut.grammar_completed) == ("length", False)


def test_the_grammar_wins_over_a_conflicting_allowed_list(llm: LLM) -> None:
    tok = llm.tokenizer
    digits = [tok.encode(str(d), add_special_tokens=False)[0] for d in range(10)]
    params = SamplingParams(max_tokens=10, temperature=0, allowed_token_ids=digits, structured_outputs={"choice": ["yes", "no"]})
    sample = llm.generate(["x"], params, use_tqdm=False)[0].outputs[0]
    assert sample.text in ("yes", "no") and sample.finish_reason == "stop"
    # where they agree, both apply: only digits, and the regex
    params = SamplingParams(max_tokens=10, temperature=0, allowed_token_ids=digits, structured_outputs={"regex": "[0-9a-z]{3}"})
    sample = llm.generate(["x"], params, use_tqdm=False)[0].outputs[0]
    assert re.fullmatch("[0-9]{3}", sample.text) and sample.finish_reason == "stop"


def test_a_stop_string_cuts_before_completion(llm: LLM) -> None:
    params = SamplingParams(max_tokens=30, temperature=0, stop=[":"], structured_outputs={"json": SCHEMAS["nested"]})
    sample = llm.generate(["x"], params, use_tqdm=False)[0].outputs[0]
    assert sample.finish_reason == "stop" and sample.stop_reason == ":" and sample.grammar_completed is False


def test_a_rejected_schema_queues_nothing(llm: LLM) -> None:
    good = SamplingParams(max_tokens=5, structured_outputs={"regex": "a+"})
    bad = SamplingParams(max_tokens=5, structured_outputs={"json": {"type": "array", "uniqueItems": True}})
    with pytest.raises(StructuredOutputError, match="Unimplemented keys"):
        llm.generate(["a", "b"], [good, bad], use_tqdm=False)
    assert not llm.engine.has_unfinished()
    with pytest.raises(ValueError, match="SamplingParams.structured_outputs: .*exactly one"):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["a"]})
    assert SamplingParams.from_mapping({"structured_outputs": {"choice": ["a"]}}).structured_outputs == StructuredOutputsParams(choice=("a",))


def test_ignore_eos_keeps_a_constrained_row_going_until_its_grammar_ends(llm: LLM) -> None:
    """EOS pushed far up (logit_bias): without ignore_eos the row ends at the first place its
    grammar accepts; with it, EOS is banned while the grammar can go on, so the row runs to
    max_tokens (same lengths as an unconstrained ignore_eos run), and a grammar that completes
    still ends the row there with `stop`."""
    eos = llm.tokenizer.eos_token_id
    assert eos is not None
    regex = {"regex": "[a-z]+"}
    pushed = SamplingParams(max_tokens=12, temperature=0, logit_bias={eos: 100.0}, structured_outputs=regex)
    early = llm.generate(["x"], pushed, use_tqdm=False)[0].outputs[0]
    assert (len(early.token_ids), early.token_ids[-1], early.finish_reason, early.grammar_completed) == (2, eos, "stop", True)
    kept = SamplingParams(max_tokens=12, temperature=0, logit_bias={eos: 100.0}, ignore_eos=True, structured_outputs=regex)
    full = llm.generate(["x", "y"], kept, use_tqdm=False)
    for out in full:
        sample = out.outputs[0]
        assert (len(sample.token_ids), sample.finish_reason) == (12, "length")
        assert eos not in sample.token_ids and re.fullmatch("[a-z]+", sample.text)
    choice = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, structured_outputs={"choice": ["a long answer"]})
    done = llm.generate(["x"], choice, use_tqdm=False)[0].outputs[0]
    assert (done.text, done.finish_reason, done.grammar_completed) == ("a long answer", "stop", True)


def test_masks_fill_beside_the_forward_pass_only_where_a_core_is_free(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU whose forward pass uses every core the fill runs first, on the engine's thread
    (no worker thread); with a core to spare it runs on the worker. The outputs are the same."""
    import os

    import torch

    engine = llm.engine
    cores = os.cpu_count() or 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: cores)
    assert not engine._mask_overlaps()
    params = [SamplingParams(max_tokens=12, temperature=0.8, seed=s, structured_outputs={"json": SCHEMAS["enum"]})
              for s in range(3)]
    engine.structured._worker = None
    serial = [o.outputs[0].token_ids for o in llm.generate(["a", "b", "c"], params, use_tqdm=False)]
    assert engine.structured._worker is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: max(1, cores - 1) if cores > 1 else 0)
    assert engine._mask_overlaps()
    overlapped = [o.outputs[0].token_ids for o in llm.generate(["a", "b", "c"], params, use_tqdm=False)]
    assert engine.structured._worker is not None
    assert overlapped == serial
