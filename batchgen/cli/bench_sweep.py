"""`batchgen bench --sweep`: what each scheduling choice buys, on one page.

Owns the sweep command: one workload's requests (built once) through every point of the
scheduling lab's grid (`batchgen.cli.lab.sweep_points`: continuous batching, chunked prefill
off, prefix caching off, static batching, at each `max_num_seqs`), each a fresh engine, real or
simulated, with the same arrivals. Writes the points as JSON (`out`) and the report page
(`<out>.html`: their table, throughput against p99 time between tokens, against waiting time).

May import: batchgen.cli (bench, lab), batchgen.data, batchgen.engine, batchgen.report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from batchgen.cli.bench import BenchResult, SimSpec, format_table, make_engine, run_engine
from batchgen.cli.lab import poisson_arrivals, sweep_points
from batchgen.data.workloads import Workload, build_workload, read_requests
from batchgen.engine.config import CacheConfig, RunnerConfig
from batchgen.engine.sampling_params import SamplingParams
from batchgen.models.checkpoint import Checkpoint, load_checkpoint

__all__ = ["run_sweep"]


def run_sweep(
    *,
    model: str | None,
    workload: Workload,
    num_requests: int,
    max_tokens: int,
    max_num_seqs: Sequence[int],
    max_num_batched_tokens: int | None,
    cache_config: CacheConfig,
    runner_config: RunnerConfig,
    clock: str = "wall",
    request_rate: float | None = None,
    ignore_eos: bool = False,
    simulate: SimSpec | None = None,
    requests_in: Path | None = None,
    out: Path | None = None,
    use_tqdm: bool = True,
    output_lens: str = "fixed",
) -> list[dict[str, Any]]:
    """Every sweep point's `BenchResult` fields plus its policy and settings, in grid order.
    `output_lens`: as `build_workload`'s."""
    checkpoint: Checkpoint | None = None
    if simulate is not None:
        tokenizer: Any = simulate.model.tokenizer
    else:
        checkpoint = load_checkpoint(model)
        tokenizer = checkpoint.tokenizer
    if requests_in is not None:
        requests = read_requests(requests_in)
    else:
        requests = build_workload(
            workload, tokenizer, num_requests=num_requests, max_tokens=max_tokens, output_lens=output_lens
        )
    prompts = [list(r.prompt_token_ids) for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=ignore_eos) for r in requests]
    arrivals = poisson_arrivals(len(requests), request_rate)
    points: list[dict[str, Any]] = []
    results: list[BenchResult] = []
    for point in sweep_points(max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, cache=cache_config):
        engine, run_clock, clock_name = make_engine(
            checkpoint, simulate, point.scheduler, point.cache, runner_config, clock=clock
        )
        result = run_engine(engine, prompts, params, outputs=None, use_tqdm=use_tqdm, desc=point.label,
                            clock=run_clock, arrivals=arrivals, clock_name=clock_name, request_rate=request_rate)
        results.append(result)
        points.append({
            **asdict(result),
            "workload": workload,
            "policy": point.policy,
            "max_num_seqs": point.max_num_seqs,
            "batching": point.scheduler.batching,
            "enable_chunked_prefill": point.scheduler.enable_chunked_prefill,
            "enable_prefix_caching": point.cache.enable_prefix_caching,
        })
    print(format_table(results))
    if out is not None:
        settings = {
            "model": model or "built-in SmolLM2-135M-Instruct",
            "workload": workload,
            "num_requests": len(requests),
            "max_tokens": max_tokens,
            "max_num_batched_tokens": max_num_batched_tokens,
            "request_rate": request_rate if request_rate is not None else "inf (all at once)",
            "ignore_eos": ignore_eos,
            "clock": results[0].clock if results else clock,
        }
        if simulate is not None:
            settings["hardware"] = simulate.hardware.as_dict()
            settings["model_priced"] = simulate.model.source
        _write(out, points, settings)
    return points


def _write(out: Path, points: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    from batchgen.io import write_json_atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, {"settings": settings, "points": points})
    try:
        from batchgen.report import write_sweep_report

        print(f"report: {write_sweep_report(out.with_suffix('.html'), points, settings=settings)}")
    except ImportError as exc:  # matplotlib is optional where nothing can be installed (GPU box)
        print(f"report: not written ({exc.name or exc} is not installed)")
