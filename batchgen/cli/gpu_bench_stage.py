"""The bench stage of `batchgen gpu-check`: the engine's output tokens/s on the device, bfloat16,
continuous against static batching, on exact token-id requests.

The requests come from a JSON-lines file (`bench --workload ... --requests-out` writes them;
jobs/gpu/gpu_job.py prepare writes the carried one), or are built from ShareGPT where the package
is installed. The first `num_prompts` are written to the work directory and replayed through
`run_workload_bench` once per batching mode, each with a fresh engine on a KV pool of
`max_kv_blocks` blocks, after a short warm-up run that compiles the kernels (its time is not
counted). Figures land in DIR/engine_bench.json and in the stage's entry; each mode's run also
as `batchgen bench --out` writes it, DIR/bench_<mode>.json with its `.timeline.parquet`, which
`batchgen simulate --calibrate DIR/bench_continuous.json` fits a profile of this device from.

Imports the cli bench and the data, engine and models layers (cli layer).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from batchgen.cli.bench import BenchResult, run_workload_bench
from batchgen.cli.gpu_stages import StageResult, write_json
from batchgen.data.workloads import BenchRequest, build_workload, read_requests, write_requests
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.models.checkpoint import load_checkpoint

__all__ = ["BENCH_FILE", "calibration_file", "run_bench_stage"]

BENCH_FILE = "engine_bench.json"
_WARMUP_REQUESTS = 8
_WARMUP_TOKENS = 4


def calibration_file(out_dir: Path, mode: str) -> Path:
    """The bench JSON of one batching mode's run (its timeline beside it), for calibration."""
    return out_dir / f"bench_{mode}.json"


def _requests(model: str | None, requests: Path | None, *, num_prompts: int, max_tokens: int) -> list[BenchRequest]:
    if requests is not None:
        return read_requests(requests)[:num_prompts]
    tokenizer = load_checkpoint(model).tokenizer
    return build_workload("single-turn", tokenizer, num_requests=num_prompts, max_tokens=max_tokens)


def run_bench_stage(
    model: str | None,
    requests: Path | None,
    *,
    out_dir: Path,
    work_dir: Path,
    num_prompts: int,
    max_tokens: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_kv_blocks: int,
    max_model_len: int,
    device: str = "cuda",
    dtype: str = "bfloat16",
) -> StageResult:
    """Warm up, then each batching mode once; ok when both modes ran. See the module docstring."""
    chosen = _requests(model, requests, num_prompts=num_prompts, max_tokens=max_tokens)
    if not chosen:
        raise ValueError(f"{requests}: no requests")
    too_long = [r.request_id for r in chosen if len(r.prompt_token_ids) + r.max_tokens > max_model_len]
    if too_long:
        raise ValueError(f"{len(too_long)} request(s) exceed max_model_len={max_model_len}, e.g. {too_long[:3]}")
    work_dir.mkdir(parents=True, exist_ok=True)
    replay = work_dir / "bench_requests.jsonl"
    write_requests(replay, chosen)
    warm = work_dir / "bench_warmup.jsonl"
    write_requests(warm, [dataclasses.replace(r, max_tokens=_WARMUP_TOKENS) for r in chosen[:_WARMUP_REQUESTS]])
    runner = RunnerConfig(device=device, dtype=dtype, max_model_len=max_model_len)
    cache = CacheConfig(num_kv_blocks=max_kv_blocks)

    def run(path: Path, batching: str, out: Path | None = None) -> BenchResult:
        sched = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            batching=batching,  # type: ignore[arg-type]
        )
        (result,) = run_workload_bench(
            model=model,
            workload="single-turn",
            num_requests=len(chosen),
            max_tokens=max_tokens,
            scheduler_config=sched,
            cache_config=cache,
            runner_config=runner,
            requests_in=path,
            use_tqdm=False,
            out=out,
        )
        return result

    run(warm, "continuous")  # compiles the kernels; not counted
    results = {mode: dataclasses.asdict(run(replay, mode, calibration_file(out_dir, mode))) for mode in ("continuous", "static")}
    for figures in results.values():
        figures["ms_per_step"] = round(1000 * figures["wall_s"] / max(1, figures["num_steps"]), 3)
    continuous, static = results["continuous"], results["static"]
    summary = {
        "model": model,
        "dtype": dtype,
        "num_requests": len(chosen),
        "prompt_tokens": continuous["prompt_tokens"],
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "num_kv_blocks": max_kv_blocks,
        "continuous_over_static": round(continuous["output_tokens_per_s"] / max(static["output_tokens_per_s"], 1e-9), 3),
        # Batch shapes differ between the modes, so bfloat16 rounding may differ: information only.
        "same_outputs": continuous["output_digest"] == static["output_digest"],
        "results": results,
    }
    write_json(out_dir / BENCH_FILE, summary)
    print(json.dumps({m: r["output_tokens_per_s"] for m, r in results.items()}), flush=True)
    return StageResult(True, summary)
