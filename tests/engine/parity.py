"""Parity against transformers in the engine's invariance modes (helpers; no tests in here).

`check_parity` runs one tiny model through the engine in each mode of `MODES` (prefix cache on
and off, a small chunk budget, a pool so small that sequences are preempted and recomputed),
greedy, with the log-probability of every generated token, and checks each run against
transformers on the same weights in float32, by teacher forcing: one forward pass over the prompt
and the engine's tokens gives transformers' `log_softmax` before each of them.

- every token is transformers' argmax on the same prefix, or a near tie there (top-2 gap below
  `NEAR_TIE`; recorded in the report, the run continues on the engine's token);
- every token's log-probability is within `LOGPROB_ATOL` (1e-4) of transformers'.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from batchgen import LLM, SamplingParams

__all__ = ["LOGPROB_ATOL", "MODES", "NEAR_TIE", "ParityReport", "check_parity", "shared_prefix_prompts"]

LOGPROB_ATOL = 1e-4
NEAR_TIE = 1e-3
NEW_TOKENS = 10

# Engine options of each invariance mode. "preempt": 24 blocks of 4 tokens for 8 sequences of up
# to 60 tokens, no admission watermark: sequences are preempted and prefilled again.
# The others get a pool of 64 blocks of 16 (allocating the default pool costs more than a run).
_POOL = {"num_kv_blocks": 64, "max_model_len": 128}
MODES: dict[str, dict[str, Any]] = {
    "prefix-cache": {"enable_prefix_caching": True, "max_num_batched_tokens": 64, **_POOL},
    "no-prefix-cache": {"enable_prefix_caching": False, "max_num_batched_tokens": 64, **_POOL},
    "chunk-8": {"enable_prefix_caching": True, "max_num_batched_tokens": 8, **_POOL},
    "preempt": {
        "block_size": 4, "num_kv_blocks": 24, "max_model_len": 64, "max_num_batched_tokens": 16,
        "admission_reserve_tokens": 0,
    },
}  # fmt: skip


def shared_prefix_prompts(vocab_size: int, *, seed: int = 7, min_len: int = 1) -> list[list[int]]:
    """Eight prompts of 10 to 50 tokens, half sharing a 21-token prefix and half its first 9
    (prefix-cache hits, blocks shared mid-block), plus one of `min_len` or more."""
    rng = random.Random(seed)
    shared = [rng.randrange(1000, min(vocab_size, 20000)) for _ in range(21)]
    prompts = []
    for i in range(7):
        own = [rng.randrange(1000, min(vocab_size, 20000)) for _ in range(rng.randint(1, 20))]
        prompts.append((shared if i % 2 == 0 else shared[:9]) + own)
    prompts.append([rng.randrange(1000, min(vocab_size, 20000)) for _ in range(max(min_len, 40))])
    return [p for p in prompts if len(p) >= min_len] or prompts[-1:]


@dataclass
class ParityReport:
    """What `check_parity` saw: the largest log-probability error, near ties (mode, prompt index,
    step, top-2 gap), preemptions in the "preempt" mode, and whether all modes gave the same
    tokens."""

    worst_logprob_error: float = 0.0
    near_ties: list[tuple[str, int, int, float]] = field(default_factory=list)
    num_preemptions: int = 0
    modes_agree: bool = True
    tokens: dict[str, list[list[int]]] = field(default_factory=dict)


def _reference_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' log-probabilities [len(tokens), vocab] before each of `tokens`."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)], dim=-1)


def transformers_model(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


def check_parity(
    folder: Path,
    prompts: list[list[int]],
    *,
    modes: Mapping[str, Mapping[str, Any]] = MODES,
    new_tokens: int = NEW_TOKENS,
    reference: torch.nn.Module | None = None,
    **engine_options: Any,
) -> ParityReport:
    """Run `prompts` through the engine on `folder` in each mode and assert parity with
    transformers (module docstring); returns what was seen. `engine_options` go to every mode."""
    ref_model = reference if reference is not None else transformers_model(folder)
    report = ParityReport()
    cache: dict[tuple[int, ...], torch.Tensor] = {}
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, logprobs=1)
    for mode, options in modes.items():
        llm = LLM(str(folder), seed=0, **{**options, **engine_options})
        outputs = llm.generate(prompts, params, use_tqdm=False)
        if mode == "preempt":
            report.num_preemptions = llm.stats()["num_preemptions"]
        mode_tokens = []
        for idx, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            assert len(tokens) == new_tokens and sample.logprobs is not None, (mode, idx)
            key = tuple(prompt + tokens)
            if key not in cache:
                cache[key] = _reference_logprobs(ref_model, prompt, tokens)
            ref = cache[key]
            for step, token in enumerate(tokens):
                top2 = torch.topk(ref[step], 2)
                if token != int(top2.indices[0]):
                    gap = float(top2.values[0] - top2.values[1])
                    assert gap < NEAR_TIE and token == int(top2.indices[1]), (
                        f"{mode}: prompt {idx} ({len(prompt)} tokens), step {step}: engine {token}, "
                        f"transformers {int(top2.indices[0])} (top-2 gap {gap:.2e})"
                    )
                    report.near_ties.append((mode, idx, step, gap))
                error = abs(sample.logprobs[step][token] - float(ref[step][token]))
                report.worst_logprob_error = max(report.worst_logprob_error, error)
                assert error < LOGPROB_ATOL, (
                    f"{mode}: prompt {idx} ({len(prompt)} tokens), step {step}: log-probability "
                    f"{sample.logprobs[step][token]:.6f} vs transformers' {float(ref[step][token]):.6f}"
                )
            mode_tokens.append(tokens)
        report.tokens[mode] = mode_tokens
    # A model sure of every token (log-probability 0) would hide any error: not a test.
    top1 = torch.cat([ref.max(dim=-1).values for ref in cache.values()])
    unsure = float((top1 < -1e-3).float().mean())
    assert unsure >= 0.5, f"the reference is all but certain of {1 - unsure:.0%} of the tokens; pick a less saturated model"
    first = next(iter(report.tokens.values()))
    report.modes_agree = all(t == first for t in report.tokens.values())
    if "preempt" in modes:
        assert report.num_preemptions > 0, "the preempt mode preempted nothing"
    return report
