"""Generate with the built-in SmolLM2-135M-Instruct for a few real ShareGPT prompts.

    python jobs/quickstart.py [--num-prompts 8] [--max-tokens 64]

Runs on the CPU in float32 in about a minute on 2 cores; prints each prompt's start, the reply
and the engine's counters.
"""

from __future__ import annotations

import argparse
import time

import torch

from batchgen import LLM, SamplingParams
from batchgen.data.sharegpt import load_sharegpt_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    prompts = load_sharegpt_prompts(args.num_prompts, max_chars=400)
    llm = LLM()  # the built-in model
    conversations = [[{"role": "user", "content": p.text}] for p in prompts]
    start = time.perf_counter()
    outputs = llm.chat(conversations, SamplingParams(temperature=0, max_tokens=args.max_tokens))
    wall = time.perf_counter() - start
    for prompt, out in zip(prompts, outputs, strict=True):
        reply = out.outputs[0]
        print(f"\n### {prompt.text[:100]!r}\n{reply.text.strip()}\n[{reply.finish_reason}, {len(reply.token_ids)} tokens]")
    stats = llm.stats()
    print(f"\n{len(outputs)} prompts in {wall:.1f} s, {stats['generation_tokens'] / wall:.1f} output tokens/s")
    print(stats)


if __name__ == "__main__":
    main()
