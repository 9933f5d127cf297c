"""The engine half of `batchgen gpu-check`: greedy tokens of the whole engine, compared across
attention backends and dtypes, like with like.

Each candidate (Triton attention in bfloat16, say) generates greedily for the same prompts as its
reference: PyTorch attention in the candidate's own dtype unless the candidate names another
(`reference_dtype`). bfloat16 against float32 moves logits by more than any fixed gap allows on a
model with small gaps, so such a pair is information (`is_gating=False`), not a verdict; the
bfloat16 verdict is Triton bfloat16 against PyTorch bfloat16.

Tokens may differ only where the reference itself nearly ties: at a prompt's first differing
position (later tokens follow from different prefixes and are not compared), the reference's
top-2 logit gap there must be at most the candidate's `max_gap`. The gap is read from the
reference's own top-2 logprobs at that position (a difference of log-probabilities is a
difference of logits). Over the common prefix, where both engines saw the same tokens, the
largest difference of the chosen token's logprob is reported too (`max_logprob_drift`).

Every engine is warmed up (a short run that compiles its kernels) before its timed run, whose
milliseconds per engine step are reported.

The comparison (`compare_greedy`) is plain Python, tested on CPU; `run_engine_comparison` runs
anywhere an engine runs (the GPU check calls it with device "cuda").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, NamedTuple

from batchgen.engine.sampling_params import SamplingParams
from batchgen.llm import LLM

__all__ = [
    "CHECK_PROMPTS",
    "DEFAULT_CANDIDATES",
    "Candidate",
    "Divergence",
    "EngineCheck",
    "EngineTiming",
    "GreedyComparison",
    "compare_greedy",
    "run_engine_check",
    "run_engine_comparison",
    "top2_gap",
]

CHECK_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Here is a list of three rivers in Europe:",
    "Once upon a time, in a small village by the sea,",
    "The main ingredients of a pancake are",
    "Translate to French: Good morning, how are you?",
    "1, 2, 3, 5, 8, 13,",
    "Photosynthesis is the process by which",
)


@dataclass(frozen=True, slots=True)
class Candidate:
    """An engine setting checked against a reference; `max_gap` in logits (nats).

    `reference_dtype` None compares against the reference backend in the candidate's own dtype;
    `is_gating` False makes the comparison information only (it does not decide `ok`)."""

    name: str
    attention_backend: str
    dtype: str
    max_gap: float
    reference_dtype: str | None = None
    is_gating: bool = True

    @property
    def reference(self) -> str:
        return self.reference_dtype or self.dtype


# Gaps (logits) within which a greedy token may differ from the reference's. Chosen, not measured
# on a GPU: Triton in float32 may use TF32 dots in the pieces it does not pin to IEEE, and two
# bfloat16 paths round attention differently; on the gpu-check model, PyTorch bfloat16 against
# float32 differed on CPU only at gaps <= 0.07 (3 of 8 prompts, 16 tokens).
DEFAULT_CANDIDATES = (
    Candidate("triton-bfloat16", "triton", "bfloat16", 0.5),
    Candidate("triton-float32", "triton", "float32", 0.05),
    Candidate("triton-bfloat16-vs-float32", "triton", "bfloat16", 0.5, reference_dtype="float32", is_gating=False),
)


@dataclass(frozen=True, slots=True)
class Divergence:
    prompt_idx: int
    position: int  # index into the generated tokens
    reference_token: int
    candidate_token: int
    reference_gap: float  # reference top-1 minus top-2 logit at that position
    is_allowed: bool


@dataclass(frozen=True, slots=True)
class GreedyComparison:
    num_prompts: int
    num_identical: int
    max_gap: float
    divergences: tuple[Divergence, ...]

    @property
    def ok(self) -> bool:
        return all(d.is_allowed for d in self.divergences)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def compare_greedy(
    reference: Sequence[Sequence[int]],
    candidate: Sequence[Sequence[int]],
    reference_gap: Callable[[int, int], float],
    *,
    max_gap: float,
) -> GreedyComparison:
    """Compare greedy outputs prompt by prompt up to the first differing token.

    `reference_gap(prompt_idx, position)` gives the reference's top-2 logit gap before its
    generated token `position`; it is asked only where the tokens differ. A candidate that
    stops early or runs longer counts as a divergence at the shorter length (the gap decides,
    as for a differing token). Raises ValueError when the prompt counts differ.
    """
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference outputs but {len(candidate)} candidate outputs")
    divergences: list[Divergence] = []
    for idx, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
        position = next((i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b), None)
        if position is None:
            if len(ref) == len(cand):
                continue
            position = min(len(ref), len(cand))
        gap = reference_gap(idx, position)
        divergences.append(
            Divergence(
                prompt_idx=idx,
                position=position,
                reference_token=ref[position] if position < len(ref) else -1,
                candidate_token=cand[position] if position < len(cand) else -1,
                reference_gap=gap,
                is_allowed=gap <= max_gap,
            )
        )
    return GreedyComparison(
        num_prompts=len(reference),
        num_identical=len(reference) - len(divergences),
        max_gap=max_gap,
        divergences=tuple(divergences),
    )


def top2_gap(llm: LLM, token_ids: Sequence[int]) -> float:
    """Top-1 minus top-2 logit of the next token after `token_ids`, from the engine's logprobs."""
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=2, ignore_eos=True)
    entry = llm.generate([list(token_ids)], params, use_tqdm=False)[0].outputs[0].logprobs
    if entry is None:
        raise RuntimeError("the engine returned no logprobs")
    values = sorted(entry[0].values(), reverse=True)
    return values[0] - values[1]


class _Greedy(NamedTuple):
    """One engine's greedy outputs: token ids, and per position the {token: logprob} of its
    top 2 (the reference's gap at a position is read from there)."""

    token_ids: list[tuple[int, ...]]
    top2: list[list[dict[int, float]]]
    num_steps: int
    wall_s: float
    num_kv_blocks: int


def _greedy(llm: LLM, prompts: Sequence[Sequence[int]], max_tokens: int) -> _Greedy:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=2)
    steps = llm.engine_stats().num_steps
    start = time.perf_counter()
    outs = llm.generate([list(p) for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - start
    top2 = [[dict(entry) for entry in (o.outputs[0].logprobs or [])] for o in outs]
    stats = llm.engine_stats()
    return _Greedy([o.outputs[0].token_ids for o in outs], top2, stats.num_steps - steps, wall, stats.num_kv_blocks)


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """One engine's timed greedy run (after a warm-up run that compiled its kernels)."""

    attention_backend: str
    dtype: str
    num_steps: int
    wall_s: float
    ms_per_step: float
    output_tokens: int
    num_kv_blocks: int


@dataclass(frozen=True, slots=True)
class EngineCheck:
    """Comparisons by candidate name, timings by engine ("torch-bfloat16", ...), and which
    comparisons decide `ok` (the others are information)."""

    comparisons: dict[str, GreedyComparison]
    timings: dict[str, EngineTiming]
    gating: dict[str, bool]
    max_logprob_drift: dict[str, float]  # candidate -> max |logprob difference| over common prefixes

    @property
    def ok(self) -> bool:
        return all(c.ok for name, c in self.comparisons.items() if self.gating[name])

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "comparisons": {
                name: {
                    **c.as_dict(),
                    "is_gating": self.gating[name],
                    "max_logprob_drift": self.max_logprob_drift[name],
                }
                for name, c in self.comparisons.items()
            },
            "timings": {name: asdict(t) for name, t in self.timings.items()},
        }


def _engine_name(backend: str, dtype: str) -> str:
    return f"{backend}-{dtype}"


def _drift(reference: _Greedy, candidate: _Greedy) -> float:
    """Largest |logprob of the same token| between the two over each prompt's common prefix
    (identical inputs there, so any difference is the backends')."""
    worst = 0.0
    for ref_ids, cand_ids, ref_top, cand_top in zip(
        reference.token_ids, candidate.token_ids, reference.top2, candidate.top2, strict=True
    ):
        for pos, (a, b) in enumerate(zip(ref_ids, cand_ids, strict=False)):
            if a != b:
                break
            if pos < len(ref_top) and pos < len(cand_top) and a in ref_top[pos] and a in cand_top[pos]:
                worst = max(worst, abs(ref_top[pos][a] - cand_top[pos][a]))
    return worst


def _gap(run: _Greedy, prompt_idx: int, position: int) -> float:
    """Top-1 minus top-2 logprob of `run` before its generated token `position`."""
    values = sorted(run.top2[prompt_idx][position].values(), reverse=True)
    if len(values) < 2:
        raise RuntimeError(f"the engine returned fewer than 2 logprobs at prompt {prompt_idx}, position {position}")
    return values[0] - values[1]


def run_engine_comparison(
    model: str | None,
    *,
    device: str,
    candidates: Sequence[Candidate],
    max_tokens: int = 32,
    reference_backend: str = "torch",
    prompts: Sequence[str] = CHECK_PROMPTS,
    kv_cache_memory_bytes: int | None = 1 << 30,
    num_kv_blocks: int | None = None,
    max_model_len: int | None = None,
) -> EngineCheck:
    """Greedy tokens of each candidate against its reference engine (`reference_backend` in the
    candidate's reference dtype), on `device`.

    Every engine (references and candidates, each (backend, dtype) once) runs the prompts twice:
    a short warm-up that compiles what it needs, then the timed run with logprobs, after which it
    is freed. A pool of `num_kv_blocks` blocks when given, else of `kv_cache_memory_bytes`.
    Raises what the engine raises (ValueError, RuntimeError, ...)."""
    options: dict[str, Any] = {"device": device}
    if num_kv_blocks is not None:
        options["num_kv_blocks"] = num_kv_blocks
    elif kv_cache_memory_bytes is not None:
        options["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    if max_model_len is not None:
        options["max_model_len"] = max_model_len
    engines: list[tuple[str, str]] = []
    for c in candidates:
        for pair in ((reference_backend, c.reference), (c.attention_backend, c.dtype)):
            if pair not in engines:
                engines.append(pair)
    runs: dict[str, _Greedy] = {}
    timings: dict[str, EngineTiming] = {}
    token_prompts: list[list[int]] | None = None
    for backend, dtype in engines:
        llm = LLM(model, dtype=dtype, attention_backend=backend, **options)
        if token_prompts is None:
            token_prompts = [llm.tokenizer.encode(p) for p in prompts]
        _greedy(llm, token_prompts[:2], 2)  # warm-up: kernels compile here, not in the timed run
        run = runs[_engine_name(backend, dtype)] = _greedy(llm, token_prompts, max_tokens)
        del llm  # its weights and KV pool go before the next engine's
        timings[_engine_name(backend, dtype)] = EngineTiming(
            attention_backend=backend,
            dtype=dtype,
            num_steps=run.num_steps,
            wall_s=round(run.wall_s, 4),
            ms_per_step=round(1000 * run.wall_s / max(1, run.num_steps), 3),
            output_tokens=sum(len(t) for t in run.token_ids),
            num_kv_blocks=run.num_kv_blocks,
        )
    comparisons: dict[str, GreedyComparison] = {}
    drift: dict[str, float] = {}
    for c in candidates:
        reference = runs[_engine_name(reference_backend, c.reference)]
        candidate = runs[_engine_name(c.attention_backend, c.dtype)]
        comparisons[c.name] = compare_greedy(
            reference.token_ids,
            candidate.token_ids,
            partial(_gap, reference),
            max_gap=c.max_gap,
        )
        drift[c.name] = round(_drift(reference, candidate), 6)
    return EngineCheck(comparisons, timings, {c.name: c.is_gating for c in candidates}, drift)


def run_engine_check(
    model: str | None,
    *,
    device: str,
    candidates: Sequence[Candidate],
    max_tokens: int = 32,
    reference_backend: str = "torch",
    prompts: Sequence[str] = CHECK_PROMPTS,
    kv_cache_memory_bytes: int = 1 << 30,
) -> dict[str, GreedyComparison]:
    """`run_engine_comparison`'s comparisons alone, by candidate name."""
    return run_engine_comparison(
        model,
        device=device,
        candidates=candidates,
        max_tokens=max_tokens,
        reference_backend=reference_backend,
        prompts=prompts,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
    ).comparisons

