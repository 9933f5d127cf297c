"""Output tokens/s of constrained vs unconstrained decoding at batch 64 (issue 22).

The same prompts and the same lengths: every row generates exactly --max-tokens tokens (EOS
ignored; the constrained rows' regex cannot complete within them), unconstrained and
constrained runs alternate, each with a fresh engine, and the medians are compared. Also
reports the grammar mask's cost per step: the worker's fill (and CPU unpack) time, and how long
a step waited for it after its forward pass.

    python jobs/bench/structured_throughput.py [--rows 64] [--max-tokens 64] [--repeats 3] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from batchgen import LLM, SamplingParams

# Words and spaces: never complete within max_tokens, so both runs generate the same lengths.
REGEX = r"([A-Za-z,.]+ ){1000}"
JSON_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "summary": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["title", "summary", "year"],
}


def _prompts(n: int) -> list[list[dict[str, str]]]:
    topics = ["rivers", "volcanoes", "the moon", "glaciers", "deserts", "tides", "forests", "cities"]
    return [[{"role": "user", "content": f"Write a long paragraph about {topics[i % 8]} (number {i})."}] for i in range(n)]


def _run(rows: int, max_tokens: int, structured: dict[str, Any] | None, threads: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    llm = LLM(None, seed=0, max_num_seqs=rows)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=structured is None, structured_outputs=structured)
    start = time.perf_counter()
    outs = llm.chat(_prompts(rows), params) if hasattr(llm, "chat") else []
    wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {"wall_s": wall, "output_tokens": tokens, "tok_per_s": tokens / wall, "steps": llm.stats()["num_steps"]}
    s = llm.engine.structured.stats()
    if s.num_masked_steps:
        result |= {
            "mask_fill_ms_per_step": 1e3 * s.fill_s / s.num_masked_steps,
            "mask_wait_ms_per_step": 1e3 * s.wait_s / s.num_masked_steps,
            "completed": sum(bool(o.outputs[0].grammar_completed) for o in outs),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"unconstrained": [], "regex": [], "json": []}
    for _ in range(args.repeats):
        runs["unconstrained"].append(_run(args.rows, args.max_tokens, None, args.threads))
        runs["regex"].append(_run(args.rows, args.max_tokens, {"regex": REGEX}, args.threads))
        runs["json"].append(_run(args.rows, args.max_tokens, {"json": JSON_SCHEMA}, args.threads))
        print(json.dumps({k: v[-1] for k, v in runs.items()}), flush=True)
    med = {k: statistics.median(r["tok_per_s"] for r in v) for k, v in runs.items()}
    report = {
        "runs": runs,
        "median_tok_per_s": med,
        "ratio_regex_same_lengths": med["regex"] / med["unconstrained"],
        "ratio_json_own_lengths": med["json"] / med["unconstrained"],
        "median_mask_fill_ms_per_step": statistics.median(r["mask_fill_ms_per_step"] for r in runs["regex"]),
        "median_mask_wait_ms_per_step": statistics.median(r["mask_wait_ms_per_step"] for r in runs["regex"]),
    }
    print(json.dumps(report, indent=2))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
