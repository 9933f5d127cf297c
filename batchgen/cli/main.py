"""Command line: `batchgen run job.yaml`, `run-batch`, `report`, `bench`, `gpu-check`,
`prepare-sharegpt`, `simulate`.

The CLI is the only place that reads environment variables and sets process-wide torch options.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchgen.cli.bench import SimSpec
    from batchgen.job.config import JobConfig
    from batchgen.sim.lengths import TokenSource

__all__ = ["main"]


def _execute(config: JobConfig, args: argparse.Namespace) -> int | None:
    """Runs a job (`run`, `run-batch`) on its executor and prints its summary table; None when it
    finished, else the exit code (2: setup, 1: runtime), its one-line message printed."""
    import torch

    from batchgen.io import InputError
    from batchgen.job.run import ConfigChangedError, run_job
    from batchgen.job.stages import JobError

    threads = args.threads or int(os.environ.get("BATCHGEN_THREADS", "0"))
    if threads:
        torch.set_num_threads(threads)
    try:
        if config.executor == "ray":
            from batchgen.ray.driver import run_ray_job

            summary = run_ray_job(config, restart=args.restart, use_tqdm=not args.quiet)
        else:
            summary = run_job(config, restart=args.restart, use_tqdm=not args.quiet)
    except (InputError, ConfigChangedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file-system failure no layer put into words: still one message
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(summary.table())
    return None


def _bench(args: argparse.Namespace) -> int:
    import torch

    from batchgen.cli.bench import run_bench

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sweep or args.workload is not None or args.simulate is not None:
        return _bench_workload(args)
    run_bench(
        model=args.model,
        num_prompts=args.num_prompts,
        max_tokens=args.max_tokens,
        modes=args.modes.split(","),
        max_num_seqs=args.max_num_seqs or 16,
        max_num_batched_tokens=args.max_num_batched_tokens or 2048,
        dtype=args.dtype,
        device=args.device,
        linear_dtype=args.linear_dtype,
        out=Path(args.out) if args.out else None,
        output_lens=args.output_lens,
        use_tqdm=not args.quiet,
    )
    return 0


def _bench_workload(args: argparse.Namespace) -> int:
    """`bench --workload ...` (and `--sweep`, `--simulate`): the engine's defaults unless
    options override them."""
    from batchgen.cli.bench import run_workload_bench
    from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig

    defaults = SchedulerConfig()
    workload = args.workload or ("multi-turn" if args.sweep else "single-turn")
    try:
        sched = SchedulerConfig(
            max_num_seqs=args.max_num_seqs or defaults.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens or defaults.max_num_batched_tokens,
            batching=args.batching,
            enable_chunked_prefill=not args.no_chunked_prefill,
        )
        cache = CacheConfig(
            kv_cache_memory_bytes=int(args.kv_cache_gib * (1 << 30)) if args.kv_cache_gib else None,
            enable_prefix_caching=not args.no_prefix_caching,
        )
        simulate = _bench_simulation(args)
        common = dict(
            model=args.model,
            workload=workload,
            num_requests=args.num_prompts,
            max_tokens=args.max_tokens,
            cache_config=cache,
            runner_config=RunnerConfig(
                device=args.device, dtype=args.dtype, linear_dtype=args.linear_dtype, max_model_len=args.max_model_len
            ),
            requests_in=Path(args.requests_in) if args.requests_in else None,
            use_tqdm=not args.quiet,
            clock=args.clock,
            request_rate=args.request_rate,
            ignore_eos=args.ignore_eos,
            simulate=simulate,
            out=Path(args.out) if args.out else None,
            output_lens=args.output_lens,
        )
        if args.sampling:
            if args.sweep or simulate is not None:
                raise ValueError("--sampling applies to a measured --workload run, not to --sweep or --simulate")
            common["sampling"] = _sampling_overrides(args.sampling)
        if args.sweep:
            from batchgen.cli.bench_sweep import run_sweep

            sizes = [int(m) for m in args.sweep_max_num_seqs.split(",") if m]
            run_sweep(max_num_seqs=sizes, max_num_batched_tokens=sched.max_num_batched_tokens, **common)
            return 0
        run_workload_bench(
            scheduler_config=sched,
            requests_out=Path(args.requests_out) if args.requests_out else None,
            outputs_out=Path(args.outputs_out) if args.outputs_out else None,
            repeats=args.repeats,
            **common,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _sampling_overrides(items: list[str]) -> dict[str, Any]:
    """`--sampling KEY=VALUE` pairs as SamplingParams fields (values read as YAML scalars or
    lists); ValueError names a malformed pair or an unknown field."""
    import dataclasses

    import yaml

    from batchgen.engine.sampling_params import SamplingParams

    known = {f.name for f in dataclasses.fields(SamplingParams)}
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key.strip() not in known:
            raise ValueError(f"--sampling {item!r}: expected FIELD=VALUE with a SamplingParams field")
        overrides[key.strip()] = yaml.safe_load(text)
    return overrides


def _bench_simulation(args: argparse.Namespace) -> SimSpec | None:
    """`bench --simulate HARDWARE`: the SimSpec of the engine modes (None without it)."""
    if args.simulate is None:
        return None
    from batchgen.cli.bench import SimSpec
    from batchgen.sim.engine import load_sim_model
    from batchgen.sim.hardware import load_hardware
    from batchgen.sim.lengths import Filler, MaxTokens, RecordedOutputs, read_bench_outputs

    model = load_sim_model(args.model, model_config=Path(args.model_config) if args.model_config else None)
    eos = [*model.config.eos_token_ids]
    filler = Filler.for_tokenizer(model.tokenizer, eos)
    tokens: TokenSource = MaxTokens(filler)
    if args.outputs_in:
        tokens = RecordedOutputs(read_bench_outputs(Path(args.outputs_in)), filler=filler, eos=eos[0])
    return SimSpec(model, load_hardware(args.simulate), tokens)


def _run(args: argparse.Namespace) -> int:
    from batchgen.job.config import JobConfigError
    from batchgen.job.config_file import load_job_config

    try:
        config = load_job_config(Path(args.job), args.set or [])
    except JobConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rc = _execute(config, args)
    if rc is not None:
        return rc
    if config.report:
        from batchgen.job.run import job_folder

        try:
            from batchgen.report import write_job_report

            path = write_job_report(job_folder(config)).html
        except ImportError as exc:  # matplotlib missing: the job's outputs are complete all the same
            print(f"{'report':<28}not written ({exc.name or exc} is not installed; report: false silences this)")
            return 0
        except (OSError, ValueError) as exc:
            print(f"error: the job finished, but its report could not be written: {exc}", file=sys.stderr)
            return 1
        print(f"{'report':<28}{path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from batchgen.io import InputError, JobFolder
    from batchgen.report import write_job_report

    target = Path(args.out_dir)
    # A job's folder, or a run-batch response file (its side files are named after it).
    folder = JobFolder.for_output_file(target) if target.is_file() else JobFolder(target)
    try:
        paths = write_job_report(folder, png=args.format == "png")
    except (FileNotFoundError, ValueError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(paths.html)
    for figure in paths.figures:
        print(figure)
    return 0


def _run_batch(args: argparse.Namespace) -> int:
    import dataclasses

    from batchgen.job.config import JobConfigError
    from batchgen.job.config_file import job_config_with_overrides

    output = Path(args.output).expanduser().resolve()
    engine = {
        key: value
        for key, value in (
            ("max_num_seqs", args.max_num_seqs),
            ("max_num_batched_tokens", args.max_num_batched_tokens),
            ("max_model_len", args.max_model_len),
            ("dtype", args.dtype),
            ("device", args.device),
        )
        if value is not None
    }
    data = {
        "model": args.model,
        "input": {"path": str(Path(args.input).expanduser().resolve()), "format": "openai_jsonl"},
        "output": {"path": str(output.parent), "format": "openai_jsonl"},
        "sampling": {"max_tokens": args.max_tokens},
        "engine": engine,
        "seed": args.seed,
        "max_error_rate": 1.0,  # a bad request line is an error line, never a dead batch
    }
    try:
        config = job_config_with_overrides(data, args.set or [], source=Path("run-batch"), base_dir=Path.cwd())
        config = dataclasses.replace(config, io=dataclasses.replace(config.io, output_name=output.name))
    except JobConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: run-batch: -o: {exc}", file=sys.stderr)
        return 2
    return _execute(config, args) or 0


def _prepare_sharegpt(args: argparse.Namespace) -> int:
    from batchgen.data.sharegpt import write_sharegpt_shards

    try:
        paths = write_sharegpt_shards(Path(args.out), num_rows=args.rows, num_shards=args.shards)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.rows} prompts in {len(paths)} shards to {args.out}")
    return 0


def _gpu_check(args: argparse.Namespace) -> int:
    from batchgen.cli.gpu_check import GpuCheckOptions, run_gpu_check

    try:
        options = GpuCheckOptions(
            out_dir=Path(args.out),
            model=args.model,
            requests=Path(args.requests) if args.requests else None,
            stages=tuple(s for s in args.stages.split(",") if s),
            preflight_only=args.preflight,
            budget_s=args.budget_s,
            max_kv_blocks=args.max_kv_blocks,
            max_model_len=args.max_model_len,
            num_prompts=args.num_prompts,
            max_tokens=args.max_tokens,
            max_num_seqs=args.max_num_seqs,
            kernel_tests_timeout_s=args.kernel_tests_timeout_s,
            work_dir=Path(args.work_dir) if args.work_dir else None,
        )
    except ValueError as exc:
        print(f"error: gpu-check: {exc}", file=sys.stderr)
        return 2
    return run_gpu_check(options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchgen", description="Offline batch text generation.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a job file: Parquet shards in, Parquet shards out, resumable")
    run.add_argument("job", help="the job file (YAML)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a job key, e.g. sampling.max_tokens=64")
    run.add_argument("--restart", action="store_true", help="discard outputs of a different configuration and start over")
    run.add_argument("--threads", type=int, default=None, help="torch threads (default: BATCHGEN_THREADS or torch's choice)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=_run)
    batch = sub.add_parser(
        "run-batch",
        help="an OpenAI Batch API request file in, its response file out (resumable, like run)",
    )
    batch.add_argument("-i", "--input", required=True, help="request file (JSONL: custom_id, method, url, body)")
    batch.add_argument(
        "-o", "--output", required=True,
        help="response file (JSONL); its manifest, summary and timeline go next to it, named after "
        "it (results.jsonl.manifest.json, ...), so several batches can share a folder",
    )
    batch.add_argument("--model", default=None, help="HF folder or .gguf (default: built-in SmolLM2-135M)")
    batch.add_argument("--max-tokens", type=int, default=16, help="for requests without max_tokens")
    batch.add_argument("--seed", type=int, default=0, help="job seed (requests without a seed derive theirs from it)")
    batch.add_argument("--max-num-seqs", type=int, default=None)
    batch.add_argument("--max-num-batched-tokens", type=int, default=None)
    batch.add_argument("--max-model-len", type=int, default=None)
    batch.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    batch.add_argument("--device", default=None)
    batch.add_argument("--set", action="append", metavar="KEY=VALUE", help="any job key, e.g. engine.block_size=32")
    batch.add_argument("--restart", action="store_true", help="discard outputs of a different configuration and start over")
    batch.add_argument("--threads", type=int, default=None, help="torch threads (default: BATCHGEN_THREADS or torch's choice)")
    batch.add_argument("--quiet", action="store_true", help="no progress bar")
    batch.set_defaults(func=_run_batch)
    report = sub.add_parser("report", help="write OUT_DIR/report.html: plots of the job's timeline, shards, errors, config")
    report.add_argument(
        "out_dir",
        help="a job's output folder (holds summary.json, manifest.json, timeline.parquet), or a "
        "run-batch response file",
    )
    report.add_argument(
        "--format", choices=["html", "png"], default="html", help="png: also write each figure as OUT_DIR/report_figures/NAME.png"
    )
    report.set_defaults(func=_report)
    prep = sub.add_parser("prepare-sharegpt", help="write real ShareGPT prompts as Parquet shards (for the demo job)")
    prep.add_argument("out", help="output folder")
    prep.add_argument("--rows", type=int, default=128)
    prep.add_argument("--shards", type=int, default=4)
    prep.set_defaults(func=_prepare_sharegpt)
    gpu = sub.add_parser(
        "gpu-check",
        help="on a CUDA machine: Triton kernels, compiled kernel tests, engine parity and tokens/s "
        "(--preflight: what would run, anywhere)",
    )
    gpu.add_argument("--out", required=True, help="folder for gpu_check.json (rewritten after every stage) and logs")
    gpu.add_argument(
        "--preflight", action="store_true",
        help="print versions, device, packages, files and the stage plan, import every module the "
        "stages need, collect the kernel tests, write OUT/gpu_check.json; runs without CUDA",
    )
    gpu.add_argument(
        "--stages", default="kernels,kernel_tests,model,engine,bench,attention",
        help="comma-separated stages to run, in this order: kernels, kernel_tests, model, engine, bench, attention",
    )
    gpu.add_argument(
        "--model", default=None,
        help="HF folder (with weights, or a random_weights.json recipe: jobs/gpu/gpu_job.py prepare) "
        "or .gguf (default: the built-in SmolLM2-135M)",
    )
    gpu.add_argument("--requests", default=None, help="bench requests as token-id JSON lines (default: built from ShareGPT)")
    gpu.add_argument("--budget-s", type=float, default=None, help="seconds for all stages; a stage with too little left is skipped")
    gpu.add_argument("--max-kv-blocks", type=int, default=8192, help="KV pool of the check's engines, in blocks")
    gpu.add_argument("--max-model-len", type=int, default=2048, help="max_model_len of the check's engines")
    gpu.add_argument("--kernel-tests-timeout-s", type=float, default=180.0, help="limit of the kernel tests' pytest run")
    gpu.add_argument("--work-dir", default=None, help="where generated weights and request files go (default: a temp folder)")
    gpu.add_argument("--num-prompts", type=int, default=256)
    gpu.add_argument("--max-tokens", type=int, default=128)
    gpu.add_argument("--max-num-seqs", type=int, default=64)
    gpu.set_defaults(func=_gpu_check)
    bench = sub.add_parser("bench", help="throughput of continuous vs static batching on ShareGPT prompts")
    bench.add_argument("--model", default=None, help="HF folder or .gguf (default: built-in SmolLM2-135M)")
    bench.add_argument("--num-prompts", type=int, default=64)
    bench.add_argument("--max-tokens", type=int, default=128)
    bench.add_argument(
        "--modes",
        default="continuous,static",
        help="comma-separated: continuous, static, transformers (HF generate on the same weights, static batches)",
    )
    bench.add_argument("--max-num-seqs", type=int, default=None, help="default: 16, or the engine's with --workload")
    bench.add_argument(
        "--output-lens",
        choices=["fixed", "sharegpt"],
        default="fixed",
        help="fixed: --max-tokens for every request; sharegpt: each request's recorded reply length, capped at "
        "--max-tokens (with --workload and --sweep too)",
    )
    bench.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: 2048, or the engine's with --workload")
    bench.add_argument(
        "--workload",
        choices=["single-turn", "multi-turn"],
        default=None,
        help="run a ShareGPT workload of token-id requests through the engine (its defaults) instead of --modes",
    )
    bench.add_argument("--requests-in", default=None, help="with --workload: replay requests from this JSON-lines file")
    bench.add_argument("--requests-out", default=None, help="with --workload: write the exact requests here (JSON lines)")
    bench.add_argument("--outputs-out", default=None, help="with --workload: write the generated token ids here")
    bench.add_argument("--repeats", type=int, default=1, help="with --workload: runs, each with a fresh engine")
    bench.add_argument("--kv-cache-gib", type=float, default=None, help="KV pool size (default: the engine's)")
    bench.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    bench.add_argument("--max-model-len", type=int, default=None, help="with --workload: the engine's max_model_len")
    bench.add_argument(
        "--linear-dtype", default=None, choices=["float32", "bfloat16"],
        help="bfloat16: the linear layers' products in bfloat16 (CPU, float32 model; opt-in, outputs can differ)",
    )
    bench.add_argument("--device", default=None)
    bench.add_argument("--threads", type=int, default=int(os.environ.get("BATCHGEN_THREADS", "0")) or None)
    bench.add_argument("--out", default=None, help="write the figures as JSON here")
    bench.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="with --workload/--sweep: times on the wall clock, or this process's CPU seconds (steadier on a shared machine)",
    )
    bench.add_argument("--request-rate", type=float, default=None, help="requests/s, Poisson arrivals (default: all at once)")
    bench.add_argument("--ignore-eos", action="store_true", help="every request generates its max_tokens")
    bench.add_argument(
        "--sampling", action="append", default=[], metavar="KEY=VALUE",
        help="with --workload: a SamplingParams field for every request (a YAML value), e.g. presence_penalty=0.5",
    )
    bench.add_argument("--batching", choices=["continuous", "static"], default="continuous", help="with --workload")
    bench.add_argument("--no-chunked-prefill", action="store_true", help="with --workload: each prompt's prefill in one step")
    bench.add_argument("--no-prefix-caching", action="store_true", help="with --workload: the radix prefix cache off")
    bench.add_argument(
        "--sweep", action="store_true",
        help="continuous vs static batching, chunked prefill and prefix caching on and off, at each "
        "--sweep-max-num-seqs; the report draws throughput against p99 time between tokens and waiting time",
    )
    bench.add_argument("--sweep-max-num-seqs", default="8,16,32", help="comma-separated max_num_seqs of the sweep")
    bench.add_argument(
        "--simulate", default=None, metavar="HARDWARE",
        help="run the engine on the simulator: a built-in profile (h100-sxm, ...) or a profile file",
    )
    bench.add_argument("--model-config", default=None, help="with --simulate: price the model of this config.json")
    bench.add_argument(
        "--outputs-in", default=None,
        help="with --simulate: replay the generated token ids of --outputs-out (request order)",
    )
    bench.add_argument("--quiet", action="store_true", help="no progress bars")
    bench.set_defaults(func=_bench)
    from batchgen.cli.simulate import add_simulate_parser

    add_simulate_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
