"""The engine half of `batchgen gpu-check`: greedy tokens of the whole engine, compared across
attention backends and dtypes on the built-in model.

A reference engine (PyTorch attention, float32) and each candidate (Triton attention in float32,
then in bfloat16) generate greedily for the same prompts. Tokens may differ only where the
reference itself nearly ties: at a prompt's first differing position (later tokens follow from
different prefixes and are not compared), the reference's top-2 logit gap there must be at most
the candidate's `max_gap`. The gap is read through the engine's own logprobs (a difference of
log-probabilities is a difference of logits).

The comparison (`compare_greedy`) is plain Python, tested on CPU; `run_engine_check` runs
anywhere an engine runs (the GPU check calls it with device "cuda").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batchgen.engine.sampling_params import SamplingParams
from batchgen.llm import LLM

__all__ = [
    "CHECK_PROMPTS",
    "Candidate",
    "Divergence",
    "GreedyComparison",
    "compare_greedy",
    "run_engine_check",
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
    """An engine setting checked against the reference; `max_gap` in logits (nats)."""

    name: str
    attention_backend: str
    dtype: str
    max_gap: float


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


def _greedy(llm: LLM, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[tuple[int, ...]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([list(p) for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


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
    """Greedy tokens of each candidate against the float32 reference engine, on `device`.

    The reference engine stays loaded (it gives the gaps) next to one candidate at a time, each
    with a KV pool of `kv_cache_memory_bytes`. Raises what the engine raises (ValueError,
    RuntimeError, ...)."""
    options: dict[str, Any] = {"device": device, "kv_cache_memory_bytes": kv_cache_memory_bytes}
    reference_llm = LLM(model, dtype="float32", attention_backend=reference_backend, **options)
    token_prompts = [reference_llm.tokenizer.encode(p) for p in prompts]
    reference = _greedy(reference_llm, token_prompts, max_tokens)

    def reference_gap(prompt_idx: int, position: int) -> float:
        return top2_gap(reference_llm, [*token_prompts[prompt_idx], *reference[prompt_idx][:position]])

    results: dict[str, GreedyComparison] = {}
    for candidate in candidates:
        llm = LLM(model, dtype=candidate.dtype, attention_backend=candidate.attention_backend, **options)
        tokens = _greedy(llm, token_prompts, max_tokens)
        del llm  # its weights and KV pool go before the next candidate's
        results[candidate.name] = compare_greedy(reference, tokens, reference_gap, max_gap=candidate.max_gap)
    return results
