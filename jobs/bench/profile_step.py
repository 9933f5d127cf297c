"""Profile decode steps at full batch on a workload: where a step's time goes.

usage: PYTHONPATH=. python jobs/bench/profile_step.py [--workload multi-turn] [--steps 3] [--backend torch]
       [--model HF_FOLDER_OR_GGUF] [--whole-run]

Queues the workload's requests (64 by default) into an engine with default settings, steps
until every sequence is decoding, then runs `--steps` decode steps under torch.profiler and
prints milliseconds per step by category (GEMMs, attention, KV writes, norms and RoPE,
SiLU-and-multiply, other ops, sampler, host work = step wall time minus the time inside torch ops).

--whole-run instead runs the workload to the end (as `batchgen bench` does: greedy, 128 new
tokens each), once plainly for its wall time and once under the profiler, and prints seconds by
category for the steps that compute prompt tokens and for the decode-only steps apart.

The profiler adds its own cost to every op it records, and not evenly: at batch 256 it put the
decode step's GEMMs at 126.7 ms where they take 102.5. So the decode-step mode also prints a
breakdown without it ("wall clock by part"): the model's calls to its kernels (projections, fused
gate/up, attention, K/V writes, norms, rotary, the LM head's greedy tokens) timed one by one with
perf_counter around each call, the projections' GFLOP/s with them.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import batchgen.models.attention as attention_module
import batchgen.models.layers as layers_module
import batchgen.models.mlp as mlp_module
from batchgen.data.workloads import build_workload
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.models.checkpoint import load_checkpoint

# First match wins: kv_write's index_copy must be tested before attention's "aten::index", and the
# named batchgen ops before attention's "batchgen::".
_CATEGORIES = (
    ("sampler", ("batchgen::greedy_screen",)),
    ("gemm", ("batchgen::greedy_estimate", "aten::addmm", "aten::mm", "aten::linear", "aten::matmul", "aten::bmm", "mkldnn::_linear_pointwise", "mkl::_mkl_linear", "batchgen::packed_linear")),
    ("kv_write", ("aten::index_copy", "batchgen::write_kv")),
    ("norm_rope", ("batchgen::rms_norm", "batchgen::rotary", "aten::rsqrt", "aten::pow", "aten::cat")),
    ("silu_mul", ("batchgen::silu_and_mul", "aten::silu")),
    ("sampler", ("aten::argmax", "batchgen::argmax", "aten::topk", "aten::softmax", "aten::exponential")),
    ("attention", ("batchgen::", "aten::scaled_dot_product", "aten::_scaled_dot", "aten::index", "aten::index_select", "attn")),
)


def _category(name: str) -> str:
    for cat, prefixes in _CATEGORIES:
        if any(name.startswith(p) or p in name for p in prefixes):
            return cat
    return "other_ops"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="multi-turn")
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: the built-in SmolLM2-135M)")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--backend", default=None, help="attention backend: torch (the reference path), cpu; default: the engine's")
    parser.add_argument("--whole-run", action="store_true", help="profile a whole run of the workload, by kind of step")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    checkpoint = load_checkpoint(args.model)
    num_params = sum(t.numel() for t in checkpoint.weights.values())  # a tied head counted once
    requests = build_workload(args.workload, checkpoint.tokenizer, num_requests=args.num_requests, max_tokens=128)
    if args.whole_run:
        _whole_run(args, checkpoint, requests)
        return
    scheduler_config = SchedulerConfig()
    engine = LLMEngine(
        checkpoint, scheduler_config=scheduler_config, cache_config=CacheConfig(), runner_config=RunnerConfig(attention_backend=args.backend)
    )
    for r in requests:
        engine.add_request(list(r.prompt_token_ids), SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True))
    start = time.perf_counter()
    num_prefill_steps = 0
    while True:
        before = engine.stats().generation_tokens
        engine.step()
        num_prefill_steps += 1
        # every seat (or every request, where they are fewer) holds a sequence and each drew a
        # token: the all-decode regime (512 requests fill the 256 seats and then wait)
        running = engine.scheduler.num_running
        full = engine.scheduler.num_waiting == 0 or running == scheduler_config.max_num_seqs
        if full and engine.stats().generation_tokens - before == running:
            break
    prefill_s = time.perf_counter() - start
    print(f"{num_prefill_steps} steps to reach all-decode in {prefill_s:.1f} s; stats {engine.stats()}")
    engine.step()  # warm
    # Without the profiler (which adds its own cost to every op): the step's time outside the
    # model's forward pass, i.e. scheduling, step arrays, sampling and detokenizing.
    # (a greedy step calls the model's final_hidden then greedy_tokens, others its forward; calls
    # inside a timed one are not timed again)
    model = engine.runner.model
    passes = {name: getattr(model, name) for name in ("forward", "final_hidden", "greedy_tokens", "logits")}
    inside = [0.0]
    depth = [0]

    def timed(run):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            if depth[0]:
                return run(*args, **kwargs)
            depth[0] += 1
            start = time.perf_counter()
            try:
                return run(*args, **kwargs)
            finally:
                depth[0] -= 1
                inside[0] += time.perf_counter() - start

        return call

    for name, run in passes.items():
        setattr(model, name, timed(run))
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    plain_ms = (time.perf_counter() - start) / args.steps * 1e3
    outside_ms = plain_ms - inside[0] / args.steps * 1e3
    for name in passes:
        delattr(model, name)
    walls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            t = time.perf_counter()
            engine.step()
            walls.append(time.perf_counter() - t)
    per_cat: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        # self time only, so nested ops are not counted twice
        per_cat[_category(evt.key)] += evt.self_cpu_time_total / 1e3 / args.steps
    wall_ms = sum(walls) / len(walls) * 1e3
    ops_ms = sum(per_cat.values())
    # the running sequences' context, where every request runs (with requests waiting, their
    # prompts are not in it and this count would include them)
    ctx = sum(len(r.prompt_token_ids) for r in requests) + engine.stats().generation_tokens
    context = str(ctx) if engine.scheduler.num_waiting == 0 else f"n/a ({engine.scheduler.num_waiting} requests waiting)"
    print(f"workload {args.workload}: batch {engine.scheduler.num_running}, context tokens {context}, "
          f"threads {torch.get_num_threads()}, step wall {wall_ms:.1f} ms")
    for cat in ("gemm", "attention", "kv_write", "norm_rope", "silu_mul", "sampler", "other_ops"):
        print(f"  {cat:<10}{per_cat[cat]:>9.1f} ms  {per_cat[cat] / wall_ms:6.1%}")
    host = wall_ms - ops_ms
    print(f"  {'host':<10}{host:>9.1f} ms  {host / wall_ms:6.1%}   (step wall minus time in torch ops)")
    print(f"  without the profiler: step {plain_ms:.1f} ms, outside the forward pass {outside_ms:.1f} ms "
          f"({outside_ms / plain_ms:.1%}: scheduler, step arrays, sampler, detokenizer)")
    gflop = 2 * num_params * engine.scheduler.num_running / 1e9
    print(f"  GEMM rate {gflop / (per_cat['gemm'] / 1e3):.0f} GFLOP/s ({gflop:.1f} GFLOP per step)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    _wall_clock_by_part(engine, args.steps)


# The model's calls to its kernels, by the module that makes them: (module, name, part).
_PARTS = (
    (attention_module, "linear", "projections"),
    (mlp_module, "linear", "projections"),
    (mlp_module, "silu_gate_up", "projections"),
    (attention_module, "paged_attention", "attention"),
    (attention_module, "write_kv", "kv_write"),
    (attention_module, "rotary_embedding", "norm_rope"),
    (attention_module, "rms_norm", "norm_rope"),
    (layers_module, "rms_norm", "norm_rope"),
)


def _wall_clock_by_part(engine: LLMEngine, steps: int) -> tuple[float, dict[str, float]]:
    """`steps` more decode steps with each kernel call of the model timed by perf_counter (no
    profiler), printed in ms per step; the projections' multiply-adds counted from their weights'
    shapes. Returns the steps' wall time and each part's seconds (they add up to it)."""
    seconds: dict[str, float] = defaultdict(float)
    flop = [0.0]

    def timed(run: Callable[..., Any], part: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return run(*args, **kwargs)
            finally:
                seconds[part] += time.perf_counter() - start
                if part == "projections":  # (x, weight, ...): a PackedLinear or an [out, in] tensor
                    weight = args[1]
                    size = weight.out_features * weight.in_features if hasattr(weight, "out_features") else weight.numel()
                    flop[0] += 2.0 * args[0].shape[0] * size

        return call

    model = engine.runner.model
    saved = [(module, name, getattr(module, name)) for module, name, _ in _PARTS]
    for module, name, part in _PARTS:
        setattr(module, name, timed(getattr(module, name), part))
    passes = ("final_hidden", "greedy_tokens", "logits")
    for name in passes:
        setattr(model, name, timed(getattr(model, name), name))
    try:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        wall = time.perf_counter() - start
    finally:
        for module, name, run in saved:
            setattr(module, name, run)
        for name in passes:
            delattr(model, name)
    inside = sum(seconds[p] for p in ("projections", "attention", "kv_write", "norm_rope"))
    rows = {
        "projections": seconds["projections"],
        "attention": seconds["attention"],
        "kv_write": seconds["kv_write"],
        "norm_rope": seconds["norm_rope"],
        "rest of the layers": seconds["final_hidden"] - inside,
        "LM head": seconds["greedy_tokens"] + seconds["logits"],
        "outside the model": wall - seconds["final_hidden"] - seconds["greedy_tokens"] - seconds["logits"],
    }
    print(f"wall clock by part, no profiler ({steps} steps, batch {engine.scheduler.num_running}): step {wall / steps * 1e3:.1f} ms")
    for part, secs in rows.items():
        print(f"  {part:<20}{secs / steps * 1e3:>9.1f} ms  {secs / wall:6.1%}")
    if seconds["projections"]:
        print(f"  projections at {flop[0] / seconds['projections'] / 1e9:.0f} GFLOP/s")
    return wall, rows


def _whole_run(args: argparse.Namespace, checkpoint: object, requests: list) -> None:  # type: ignore[type-arg]
    def run(prof: profile | None) -> tuple[float, list[bool]]:
        engine = LLMEngine(
            checkpoint,  # type: ignore[arg-type]
            scheduler_config=SchedulerConfig(), cache_config=CacheConfig(),
            runner_config=RunnerConfig(attention_backend=args.backend),
        )  # fmt: skip
        for r in requests:
            engine.add_request(list(r.prompt_token_ids), SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True))
        kinds: list[bool] = []  # per step: did it compute prompt tokens
        start = time.perf_counter()
        while engine.has_unfinished():
            before = engine.stats().prefill_tokens_computed
            with record_function(f"step {len(kinds)}"):
                engine.step()
            kinds.append(engine.stats().prefill_tokens_computed > before)
        return time.perf_counter() - start, kinds

    plain_s, _ = run(None)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled_s, kinds = run(prof)
    # each op's self time goes to the step (the record_function range) it ran under
    per: dict[tuple[bool, str], float] = defaultdict(float)
    steps: dict[bool, float] = defaultdict(float)
    for evt in prof.events():
        if evt.name.startswith("step "):
            steps[kinds[int(evt.name[5:])]] += evt.cpu_time_total / 1e6
            continue
        root = evt
        while root.cpu_parent is not None:
            root = root.cpu_parent
        if root.name.startswith("step "):
            per[(kinds[int(root.name[5:])], _category(evt.name))] += evt.self_cpu_time_total / 1e6
    print(f"workload {args.workload}, {len(requests)} requests, threads {torch.get_num_threads()}: "
          f"run {plain_s:.2f} s ({profiled_s:.2f} s under the profiler), {len(kinds)} steps, "
          f"{sum(kinds)} of them with prompt tokens")
    cats = ("gemm", "attention", "kv_write", "norm_rope", "silu_mul", "sampler", "other_ops")
    print(f"  {'':<10}{'prompt steps':>14}{'decode steps':>14}{'all':>9}")
    for cat in (*cats, "host"):
        cells = []
        for kind in (True, False):
            ops = sum(per[(kind, c)] for c in cats)
            cells.append(steps[kind] - ops if cat == "host" else per[(kind, cat)])
        print(f"  {cat:<10}{cells[0]:>12.2f} s{cells[1]:>12.2f} s{sum(cells):>7.2f} s")
    print(f"  {'steps':<10}{steps[True]:>12.2f} s{steps[False]:>12.2f} s{steps[True] + steps[False]:>7.2f} s")


if __name__ == "__main__":
    main()
