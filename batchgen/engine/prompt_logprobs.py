"""Prompt log-probabilities from a step's prompt-logits rows (`StepLogits.prompt_logits`).

A pure function over tensors and lists: position p's logits row gives the log-probability of
token p + 1 (the first prompt token has none). One log_softmax and one gather for all rows of
the step, one top-k for the largest k asked; then the {token_id: logprob} dicts of each row.

May import: torch, batchgen.engine.step_arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchgen.engine.step_arrays import PromptLogitsSpan

__all__ = ["prompt_logprob_entries"]


def prompt_logprob_entries(
    logits: torch.Tensor,
    spans: Sequence[PromptLogitsSpan],
    targets: Sequence[int],
    num_top: Sequence[int],
) -> list[list[dict[int, float]]]:
    """Per span, one dict per row: the target token's log-probability (`targets`, one per row
    of `logits`, in span order) and the span's `num_top` top ones (0: the target's only)."""
    logprobs = torch.log_softmax(logits, dim=-1)
    index = torch.tensor(list(targets), dtype=torch.int64, device=logprobs.device)
    own = logprobs.gather(1, index[:, None])[:, 0].tolist()
    k_max = max(num_top, default=0)
    top_ids: list[list[int]] = []
    top_values: list[list[float]] = []
    if k_max > 0:
        top = torch.topk(logprobs, k_max, dim=-1)
        top_ids, top_values = top.indices.tolist(), top.values.tolist()
    result: list[list[dict[int, float]]] = []
    row = 0
    for span, k in zip(spans, num_top, strict=True):
        entries = []
        for _ in range(span.num_positions):
            entry = dict(zip(top_ids[row][:k], top_values[row][:k], strict=True)) if k else {}
            entry[targets[row]] = own[row]
            entries.append(entry)
            row += 1
        result.append(entries)
    return result
