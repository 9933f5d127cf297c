"""`batchgen bench`: throughput of the engine's batching modes, side by side in one process.

All modes run the same prompts with the same weights, one after the other, so the ratios are
comparable even on a shared, noisy machine. Figures come out as a table and as JSON, and with
the JSON a report page (`<out>.html`: the modes side by side, the engine modes' timelines
overlaid).

Every engine run goes through the scheduling lab (`batchgen.cli.lab`): requests all at once or
arriving at `request_rate` (Poisson), each request's latency record (queue wait, TTFT, time
between tokens, end to end) summarized in the result, measured on the wall or CPU clock, or
simulated (`SimSpec`: the same engine on a hardware profile's cost model, no model run).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
from tqdm.auto import tqdm

from batchgen.data.sharegpt import load_sharegpt_prompts
from batchgen.data.workloads import (
    BenchRequest,
    Workload,
    build_workload,
    read_requests,
    write_requests,
)
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.timeline import TimelineRow
from batchgen.job.timeline_file import describe_environment, new_run_id, timeline_table
from batchgen.models.checkpoint import Checkpoint, load_checkpoint

if TYPE_CHECKING:
    from batchgen.cli.lab import LabClock
    from batchgen.sim.engine import SimModel
    from batchgen.sim.hardware import HardwareProfile
    from batchgen.sim.lengths import TokenSource

__all__ = ["BenchResult", "SimSpec", "make_engine", "run_bench", "run_engine", "run_workload_bench"]


@dataclass(frozen=True, slots=True)
class BenchResult:
    mode: str
    wall_s: float
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    total_tokens_per_s: float
    num_steps: int
    prefill_tokens_computed: int
    cached_prompt_tokens: int
    num_preemptions: int
    peak_kv_blocks_used: int
    output_digest: str  # sha256 of every request's output token ids, in request order
    workload: str = "sharegpt"
    # How it ran: requests/s of the arrivals (None: all at once), the clock the times are on
    # ("wall", "cpu", or "simulated <hardware>").
    request_rate: float | None = None
    clock: str = "wall"
    # Latency records (seconds; `batchgen.cli.lab.latency_summary`): over requests, and for
    # tbt over every gap between two tokens of a request.
    queue_mean_s: float = 0.0
    queue_p50_s: float = 0.0
    queue_p99_s: float = 0.0
    ttft_mean_s: float = 0.0
    ttft_p50_s: float = 0.0
    ttft_p99_s: float = 0.0
    tbt_mean_s: float = 0.0
    tbt_p50_s: float = 0.0
    tbt_p99_s: float = 0.0
    e2e_mean_s: float = 0.0
    e2e_p50_s: float = 0.0
    e2e_p99_s: float = 0.0
    tpot_mean_s: float = 0.0
    # Seconds in the sampler (logits processors, draw, logprobs) over the run's steps.
    sampler_s: float = 0.0
    # Structured output: steps with constrained rows, the worker's mask fill time and the time
    # steps waited for it after their forward pass (batchgen.engine.structured.StructuredStats).
    masked_steps: int = 0
    mask_fill_s: float = 0.0
    mask_wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SimSpec:
    """Run the engine modes simulated: the model as priced, the hardware, the token source."""

    model: SimModel
    hardware: HardwareProfile
    tokens: TokenSource


def _digest(outputs: Sequence[Sequence[int]]) -> str:
    return hashlib.sha256(json.dumps([list(o) for o in outputs]).encode()).hexdigest()


class _ModeRun(NamedTuple):
    result: BenchResult
    timeline: list[TimelineRow]
    device: str
    dtype: str
    num_kv_blocks: int


def _run_mode(
    checkpoint: Checkpoint,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    *,
    batching: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    dtype: str | None,
    device: str | None,
    use_tqdm: bool,
    cache_config: CacheConfig | None = None,
    linear_dtype: str | None = None,
    outputs: dict[int, tuple[int, ...]] | None = None,
) -> _ModeRun:
    """Run every prompt through one engine; fills `outputs` (prompt index -> generated ids)."""
    engine = LLMEngine(
        checkpoint,
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            batching=batching,  # type: ignore[arg-type]
        ),
        cache_config=cache_config or CacheConfig(),
        runner_config=RunnerConfig(device=device, dtype=dtype, linear_dtype=linear_dtype),  # type: ignore[arg-type]
    )
    result = run_engine(engine, prompts, params, outputs=outputs, use_tqdm=use_tqdm, desc=batching)
    model = engine.runner.model
    return _ModeRun(
        _replace_mode(result, batching, "sharegpt"),
        engine.timeline.rows(),
        str(model.device),
        str(model.dtype),
        engine.stats().num_kv_blocks,
    )


def run_engine(
    engine: LLMEngine,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    *,
    outputs: dict[int, tuple[int, ...]] | None,
    use_tqdm: bool,
    desc: str,
    clock: LabClock | None = None,
    arrivals: Sequence[float] | None = None,
    clock_name: str = "wall",
    request_rate: float | None = None,
) -> BenchResult:
    """Queue each prompt at its arrival (all at once by default), step until done; the time
    covers the steps only, on `clock` (the engine's own; wall time by default). Fills `outputs`
    (prompt index -> generated ids)."""
    from batchgen.cli.lab import drive, lab_clock, latency_summary

    run = drive(engine, prompts, params, clock=clock or lab_clock("wall"), arrivals=arrivals,
                use_tqdm=use_tqdm, desc=desc)
    collected: dict[int, tuple[int, ...]] = {} if outputs is None else outputs
    collected.update(run.outputs)
    wall = max(run.wall_s, 1e-9)
    stats = engine.stats()
    structured = engine.structured.stats()
    prompt_tokens = sum(len(p) for p in prompts)
    fields: dict[str, Any] = dict(
        mode=desc,
        wall_s=round(wall, 3),
        num_requests=len(prompts),
        prompt_tokens=prompt_tokens,
        output_tokens=stats.generation_tokens,
        output_tokens_per_s=round(stats.generation_tokens / wall, 2),
        total_tokens_per_s=round((stats.generation_tokens + prompt_tokens) / wall, 2),
        num_steps=stats.num_steps,
        prefill_tokens_computed=stats.prefill_tokens_computed,
        cached_prompt_tokens=stats.cached_prompt_tokens,
        num_preemptions=stats.num_preemptions,
        peak_kv_blocks_used=stats.peak_kv_blocks_used,
        output_digest=_digest([collected[i] for i in range(len(prompts))]),
        request_rate=request_rate,
        clock=clock_name,
        sampler_s=round(engine.sampler_s, 4),
        masked_steps=structured.num_masked_steps,
        mask_fill_s=round(structured.fill_s, 4),
        mask_wait_s=round(structured.wait_s, 4),
    )
    fields.update(latency_summary([run.metrics[i] for i in sorted(run.metrics)]))
    return BenchResult(**fields)


def _run_transformers(
    checkpoint: Checkpoint,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    *,
    batch_size: int,
    dtype: str | None,
    device: str | None,
    use_tqdm: bool,
) -> BenchResult:
    """Hugging Face transformers on the same weights: left-padded static batches of
    `batch_size`, `generate` with its KV cache, greedy. A row's useful tokens stop at EOS or
    its own max_tokens; the batch runs until its longest row is done (what static batching is).
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise ValueError("the transformers mode needs transformers (pip install 'batchgen[test]')") from exc
    source = checkpoint.source
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype or "", torch.float32)
    ref: Any
    if source.suffix == ".gguf":
        ref = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch_dtype)
    else:
        ref = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch_dtype)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    ref = ref.to(device=dev).eval()
    eos = set(checkpoint.config.eos_token_ids)
    pad = next(iter(eos)) if eos else 0
    output_tokens = 0
    generated: list[list[int]] = []
    bar = tqdm(total=len(prompts), desc="bench transformers", unit="req", disable=not use_tqdm)
    start = time.perf_counter()
    for b in range(0, len(prompts), batch_size):
        batch = prompts[b : b + batch_size]
        limits = [p.max_tokens for p in params[b : b + batch_size]]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in batch], device=dev)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=dev)
        with torch.inference_mode():
            out = ref.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max(limits), do_sample=False, pad_token_id=pad
            )
        for row, limit in zip(out[:, width:].tolist(), limits, strict=True):
            useful = 0
            for token in row[:limit]:
                useful += 1
                if token in eos:
                    break
            output_tokens += useful
            generated.append(row[:useful])
        bar.update(len(batch))
    wall = time.perf_counter() - start
    bar.close()
    prompt_tokens = sum(len(p) for p in prompts)
    return BenchResult(
        mode="transformers",
        wall_s=round(wall, 3),
        num_requests=len(prompts),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        output_tokens_per_s=round(output_tokens / wall, 2),
        total_tokens_per_s=round((output_tokens + prompt_tokens) / wall, 2),
        num_steps=0,
        prefill_tokens_computed=prompt_tokens,
        cached_prompt_tokens=0,
        num_preemptions=0,
        peak_kv_blocks_used=0,
        output_digest=_digest(generated),
    )


def run_bench(
    *,
    model: str | None,
    num_prompts: int,
    max_tokens: int,
    modes: Sequence[str],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    dtype: str | None,
    device: str | None,
    out: Path | None,
    output_lens: str = "fixed",
    use_tqdm: bool = True,
    linear_dtype: str | None = None,
) -> list[BenchResult]:
    """Chat-templated ShareGPT prompts, greedy, for every mode.

    output_lens "fixed": up to `max_tokens` new tokens each; "sharegpt": each request's limit is
    the token length of the conversation's recorded reply, capped at `max_tokens` (the usual
    ShareGPT serving benchmark), so lengths vary as they do in real traffic.
    """
    checkpoint = load_checkpoint(model)
    tok = checkpoint.tokenizer
    records = load_sharegpt_prompts(num_prompts, max_chars=1500)
    prompts = [tok.encode_chat([{"role": "user", "content": p.text}]) for p in records]
    if output_lens == "fixed":
        params: list[SamplingParams] = [SamplingParams(temperature=0, max_tokens=max_tokens)] * len(prompts)
    elif output_lens == "sharegpt":
        params = [
            SamplingParams(
                temperature=0,
                max_tokens=max(1, min(max_tokens, len(tok.encode(p.reply or "", add_special_tokens=False)))),
            )
            for p in records
        ]
    else:
        raise ValueError(f"output_lens must be 'fixed' or 'sharegpt', got {output_lens!r}")
    unknown = [m for m in modes if m not in ("continuous", "static", "transformers")]
    if unknown:
        raise ValueError(f"unknown bench mode(s) {', '.join(unknown)}; choose from continuous, static, transformers")
    results = []
    engine_runs: dict[str, _ModeRun] = {}
    for mode in modes:
        if mode == "transformers":
            results.append(
                _run_transformers(
                    checkpoint, prompts, params, batch_size=max_num_seqs, dtype=dtype, device=device, use_tqdm=use_tqdm
                )
            )
            continue
        run = _run_mode(
            checkpoint,
            prompts,
            params,
            batching=mode,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            dtype=dtype,
            device=device,
            use_tqdm=use_tqdm,
            linear_dtype=linear_dtype,
        )
        results.append(run.result)
        engine_runs[mode] = run
    print(format_table(results))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "model": str(checkpoint.source),
            "num_prompts": num_prompts,
            "max_tokens": max_tokens,
            "max_num_seqs": max_num_seqs,
            "output_lens": output_lens,
            "results": [asdict(r) for r in results],
        }
        out.write_text(json.dumps(payload, indent=2))
        settings = {**{k: v for k, v in payload.items() if k != "results"},
                    "max_num_batched_tokens": max_num_batched_tokens, "dtype": dtype, "device": device}
        try:
            print(f"report: {_write_report(out.with_suffix('.html'), results, engine_runs, settings)}")
        except ImportError as exc:  # matplotlib is optional where nothing can be installed (GPU box)
            print(f"report: not written ({exc.name or exc} is not installed)")
    return results


def _write_report(
    path: Path, results: Sequence[BenchResult], runs: dict[str, _ModeRun], settings: dict[str, Any]
) -> Path:
    from batchgen.report import write_bench_report

    run_id = new_run_id()
    tables = [timeline_table(r.timeline, run_id=f"{run_id}-{mode}", run_index=i) for i, (mode, r) in enumerate(runs.items())]
    first = next(iter(runs.values()), None)
    if first is not None:
        settings = {**settings, **describe_environment(first.device, first.dtype, first.num_kv_blocks)}
    labels = dict(enumerate(runs))
    timeline = pa.concat_tables(tables) if tables else None
    path = write_bench_report(path, [asdict(r) for r in results], timeline=timeline, labels=labels, settings=settings)
    return path


def run_workload_bench(
    *,
    model: str | None,
    workload: Workload,
    num_requests: int,
    max_tokens: int,
    scheduler_config: SchedulerConfig,
    cache_config: CacheConfig,
    runner_config: RunnerConfig,
    requests_in: Path | None = None,
    requests_out: Path | None = None,
    outputs_out: Path | None = None,
    repeats: int = 1,
    use_tqdm: bool = True,
    clock: str = "wall",
    request_rate: float | None = None,
    ignore_eos: bool = False,
    simulate: SimSpec | None = None,
    out: Path | None = None,
    sampling: Mapping[str, Any] | None = None,
    output_lens: str = "fixed",
) -> list[BenchResult]:
    """One of the ShareGPT workloads (see workloads.py; `output_lens` "sharegpt": each request's
    limit is its recorded reply's length, capped at `max_tokens`), greedy, stop at EOS (unless
    `ignore_eos`; `sampling`: more SamplingParams fields for every request, such as
    penalties, to measure what they cost), through the engine with the given configuration, `repeats` times (a fresh
    engine each), requests all at once or arriving at `request_rate` (Poisson, seed 0).

    `requests_in` replays requests written earlier instead of building them; `requests_out`
    writes the exact requests; `outputs_out` writes each request's generated token ids (of the
    last repeat) as JSON lines {"request_id", "token_ids"}. `clock`: "wall" or "cpu" (this
    process's CPU seconds; steadier on a shared machine). `simulate`: the engine runs on the
    simulator instead (no model; times are the cost model's). `out`: the results as JSON, with
    the run's model and engine (what calibration reads) and `<out>.timeline.parquet`.
    """
    from batchgen.cli.lab import poisson_arrivals

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
    if requests_out is not None:
        write_requests(requests_out, requests)
    prompts = [list(r.prompt_token_ids) for r in requests]
    extra = dict(sampling or {})
    params = [
        SamplingParams(**{"temperature": 0, **extra, "max_tokens": r.max_tokens, "ignore_eos": ignore_eos})
        for r in requests
    ]
    arrivals = poisson_arrivals(len(requests), request_rate)
    results: list[BenchResult] = []
    outputs: dict[int, tuple[int, ...]] = {}
    timelines: list[list[TimelineRow]] = []
    engine: LLMEngine | None = None
    for _ in range(repeats):
        engine, run_clock, clock_name = make_engine(
            checkpoint, simulate, scheduler_config, cache_config, runner_config, clock=clock
        )
        outputs.clear()
        result = run_engine(engine, prompts, params, outputs=outputs, use_tqdm=use_tqdm, desc=workload,
                            clock=run_clock, arrivals=arrivals, clock_name=clock_name, request_rate=request_rate)
        results.append(_replace_mode(result, "simulated" if simulate is not None else "batchgen", workload))
        timelines.append(engine.timeline.rows())
    if outputs_out is not None:
        _write_outputs(outputs_out, requests, outputs)
    print(format_table(results))
    if simulate is None:
        for r in results:
            share = r.sampler_s / r.wall_s if r.wall_s else 0.0
            print(f"sampler: {1000 * r.sampler_s / max(r.num_steps, 1):.2f} ms a step, {share:.1%} of the run")
            if r.masked_steps:
                print(f"grammar masks: {r.masked_steps} steps, filled in {1000 * r.mask_fill_s / r.masked_steps:.2f} ms a "
                      f"step (beside the forward pass where it leaves a core free, else before it), "
                      f"waited for {1000 * r.mask_wait_s / r.masked_steps:.3f} ms a step")
    if out is not None and engine is not None:
        _write_workload_json(out, results, timelines, engine, model=model, simulate=simulate,
                             block_size=cache_config.block_size)
    return results


def make_engine(
    checkpoint: Checkpoint | None,
    simulate: SimSpec | None,
    scheduler_config: SchedulerConfig,
    cache_config: CacheConfig,
    runner_config: RunnerConfig,
    *,
    clock: str,
) -> tuple[LLMEngine, LabClock, str]:
    """A fresh engine (simulated when `simulate` is given, else over `checkpoint`), the lab
    clock it runs on and that clock's name for the results."""
    from batchgen.cli.lab import engine_clock, lab_clock

    if simulate is not None:
        from batchgen.engine.config import EngineConfigs
        from batchgen.sim.engine import build_sim_engine

        sim = build_sim_engine(simulate.model, EngineConfigs(scheduler_config, cache_config, runner_config),
                               simulate.hardware, simulate.tokens)
        return sim.engine, lab_clock("sim", sim.clock), f"simulated {simulate.hardware.name}"
    if checkpoint is None:
        raise ValueError("a real engine needs a checkpoint")
    engine = LLMEngine(
        checkpoint,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        runner_config=runner_config,
        clock=engine_clock(clock),
    )
    return engine, lab_clock(clock), clock


def _write_workload_json(
    out: Path,
    results: Sequence[BenchResult],
    timelines: Sequence[list[TimelineRow]],
    engine: LLMEngine,
    *,
    model: str | None,
    simulate: SimSpec | None,
    block_size: int,
) -> None:
    """`out` (results and the run's model and engine) and `<out>.timeline.parquet`."""
    from batchgen.io import write_json_atomic, write_parquet_atomic

    engine_info: dict[str, Any]
    if simulate is not None:
        dtype = f"{simulate.hardware.dtype_bytes}-byte"
        engine_info = {"device": f"simulated {simulate.hardware.name}", "dtype": dtype, "num_kv_blocks": engine.kv.num_blocks}
    else:
        m = engine.runner.model
        engine_info = {"device": str(m.device), "dtype": str(m.dtype), "num_kv_blocks": engine.kv.num_blocks}
        if m.linear_dtype != m.dtype:
            engine_info["linear_dtype"] = str(m.linear_dtype)
    run = {"model": model, "engine": engine_info, "block_size": block_size}
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, {"run": run, "results": [asdict(r) for r in results]})
    run_id = new_run_id()
    tables = [timeline_table(rows, run_id=f"{run_id}-{i}", run_index=i) for i, rows in enumerate(timelines)]
    write_parquet_atomic(out.with_suffix(".timeline.parquet"), pa.concat_tables(tables))


def _replace_mode(result: BenchResult, mode: str, workload: str) -> BenchResult:
    fields = asdict(result)
    fields.update(mode=mode, workload=workload)
    return BenchResult(**fields)


def _write_outputs(path: Path, requests: Sequence[BenchRequest], outputs: dict[int, tuple[int, ...]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i, r in enumerate(requests):
            f.write(json.dumps({"request_id": r.request_id, "token_ids": list(outputs[i])}) + "\n")


def format_table(results: Sequence[BenchResult]) -> str:
    base = results[-1].output_tokens_per_s if results else 0.0
    width = max([12, *(len(r.mode) + 1 for r in results)])
    lines = [
        f"{'mode':<{width}}{'wall s':>9}{'out tok':>9}{'out tok/s':>11}{'vs last':>9}{'steps':>8}{'prefill':>9}{'preempt':>9}"
    ]
    for r in results:
        ratio = r.output_tokens_per_s / base if base else float("nan")
        lines.append(
            f"{r.mode:<{width}}{r.wall_s:>9.1f}{r.output_tokens:>9}{r.output_tokens_per_s:>11.1f}{ratio:>8.2f}x"
            f"{r.num_steps:>8}{r.prefill_tokens_computed:>9}{r.num_preemptions:>9}"
        )
    return "\n".join(lines)
