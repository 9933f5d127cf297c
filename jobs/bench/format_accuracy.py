"""Accuracy of bfloat16 linear layers (`linear_dtype: bfloat16`) against float32 (issue 25).

usage: python jobs/bench/format_accuracy.py [--num-requests 64] [--max-tokens 128]
                                            [--workloads single-turn,multi-turn] [--model PATH]

Per ShareGPT workload (the requests `batchgen bench --workload` builds):

1. Greedy generation (stop at EOS) with float32 and with bfloat16 linear layers, same requests:
   the share of requests whose tokens are all equal, and the share of generated tokens before
   each request's first difference.
2. Teacher-forced along the float32 outputs: each request's prompt plus its float32 reply goes
   through both models in one pass (prefix caching off, one request a step), and the next-token
   distributions at the reply's positions are compared: mean KL(float32 || bfloat16) in nats,
   and the share of positions whose argmax agrees ("replayed": the share where the float32
   pass's argmax is the float32 reply's token, a check of the alignment: about 100%).

The two models are the engine's own (`LLMEngine`, compiled CPU path); the logits are read from
the model's forward pass. Prints one line per workload.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import torch

from batchgen.data.workloads import BenchRequest, build_workload
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.models.checkpoint import Checkpoint, load_checkpoint


def _engine(checkpoint: Checkpoint, linear_dtype: str | None, *, one_at_a_time: bool) -> LLMEngine:
    scheduler = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=4096) if one_at_a_time else SchedulerConfig()
    return LLMEngine(
        checkpoint,
        scheduler_config=scheduler,
        cache_config=CacheConfig(enable_prefix_caching=not one_at_a_time),
        runner_config=RunnerConfig(linear_dtype=linear_dtype),  # type: ignore[arg-type]
    )


def _generate(engine: LLMEngine, requests: Sequence[BenchRequest]) -> list[tuple[int, ...]]:
    ids = [
        engine.add_request(list(r.prompt_token_ids), SamplingParams(temperature=0, max_tokens=r.max_tokens))
        for r in requests
    ]
    done: dict[int, tuple[int, ...]] = {}
    while len(done) < len(ids):
        for out in engine.step():
            done[out.request_id] = tuple(out.outputs[0].token_ids)
    return [done[i] for i in ids]


def _sequence_logits(engine: LLMEngine, token_ids: list[int]) -> torch.Tensor:
    """Logits [len(token_ids), vocab] of every position of `token_ids`, in one forward pass."""
    model = engine.runner.model
    captured: list[torch.Tensor] = []
    forward = model.forward

    def capture(*args, **kwargs):  # type: ignore[no-untyped-def]
        logits = forward(*args, **kwargs)
        captured.append(logits.clone())
        return logits

    model.forward = capture  # type: ignore[method-assign]
    try:
        engine.add_request(token_ids, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
        while not engine.step():
            pass
    finally:
        model.forward = forward  # type: ignore[method-assign]
    if len(captured) != 1 or captured[0].shape[0] != len(token_ids):
        raise RuntimeError(f"expected one pass of {len(token_ids)} rows, got {[c.shape for c in captured]}")
    rows = captured[0]
    # Row 0 is the sampling row (the last position), then the prompt positions 0 .. n-2 in order.
    return torch.cat([rows[1:], rows[:1]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--workloads", default="single-turn,multi-turn")
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: the built-in SmolLM2)")
    args = parser.parse_args()
    checkpoint = load_checkpoint(args.model)
    print(f"{'workload':<13}{'requests equal':>16}{'tokens before 1st diff':>24}{'mean KL (nats)':>16}"
          f"{'argmax agrees':>15}{'replayed':>11}")  # fmt: skip
    for workload in args.workloads.split(","):
        requests = build_workload(
            workload, checkpoint.tokenizer, num_requests=args.num_requests, max_tokens=args.max_tokens  # type: ignore[arg-type]
        )
        ref = _generate(_engine(checkpoint, None, one_at_a_time=False), requests)
        low = _generate(_engine(checkpoint, "bfloat16", one_at_a_time=False), requests)
        equal = sum(a == b for a, b in zip(ref, low, strict=True))
        before = []
        for a, b in zip(ref, low, strict=True):
            k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            before.append(k / max(len(a), 1))
        ref_engine = _engine(checkpoint, None, one_at_a_time=True)
        low_engine = _engine(checkpoint, "bfloat16", one_at_a_time=True)
        kls: list[float] = []
        agree = replayed = total = 0
        for r, out in zip(requests, ref, strict=True):
            seq = list(r.prompt_token_ids) + list(out)
            p = torch.log_softmax(_sequence_logits(ref_engine, seq).double(), dim=-1)
            q = torch.log_softmax(_sequence_logits(low_engine, seq).double(), dim=-1)
            # positions len(prompt)-1 .. len(seq)-2 predict the reply's tokens
            sl = slice(len(r.prompt_token_ids) - 1, len(seq) - 1)
            p, q = p[sl], q[sl]
            kls.extend((p.exp() * (p - q)).sum(dim=-1).tolist())
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
            replayed += int((p.argmax(-1) == torch.tensor(out)).sum())
            total += p.shape[0]
        print(
            f"{workload:<13}{f'{equal}/{len(requests)}':>16}{statistics.mean(before):>24.1%}"
            f"{statistics.mean(kls):>16.2e}{agree / total:>15.2%}{replayed / total:>11.2%}",
            flush=True,
        )


if __name__ == "__main__":
    main()
