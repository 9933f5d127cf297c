"""`batchgen simulate`: a job's predicted run on hardware it need not have, and calibration.

    batchgen simulate job.yaml [--hardware NAME|FILE.yaml] [--model-config config.json]
                               [--workers N] [--output-lens max-tokens|sharegpt]
                               [--outputs-from RUN_DIR] [--core auto|compiled|python] [--out DIR]
    batchgen simulate --calibrate RUN_DIR [RUN_DIR ...] --out PROFILE.yaml [--model-config config.json]

The first prints the predicted figures (and with `--out` writes `summary.json`,
`timeline.parquet` and `report.html`, marked as simulated); the second fits this machine's
profile from a real run (`batchgen.sim.calibrate`). Exit codes: 0 done, 2 a bad job file,
input or option (one message, no traceback).

May import: batchgen.sim, batchgen.job, batchgen.report.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchgen.job.config import JobConfig
    from batchgen.sim.engine import SimModel
    from batchgen.sim.lengths import TokenSource

__all__ = ["add_simulate_parser", "run_simulate"]


def add_simulate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser(
        "simulate",
        help="predict a job's run on given hardware: its real rows through the real scheduler and cache on a cost model",
    )
    sim.add_argument("job", nargs="?", default=None, help="the job file (YAML)")
    sim.add_argument("--hardware", default="h100-sxm", help="a built-in profile (a100-80gb, h100-sxm, h200, l4) or a profile file")
    sim.add_argument("--model-config", default=None, help="price the model this config.json describes (no weights needed)")
    sim.add_argument("--workers", type=int, default=None, help="shards over N engines as the Ray driver hands them out")
    sim.add_argument(
        "--output-lens",
        choices=["max-tokens", "sharegpt"],
        default=None,
        help="each sample runs to max_tokens, or stops at a ShareGPT reply length (default: max-tokens "
        "when the job sets ignore_eos, else sharegpt)",
    )
    sim.add_argument("--outputs-from", default=None, help="replay the output lengths (and tokens) of a previous run's folder")
    sim.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a job key, e.g. engine.max_num_seqs=64")
    sim.add_argument(
        "--calibrate", default=None, nargs="+", metavar="RUN_DIR",
        help="fit this machine's profile from a run's timeline (or several runs' of one model: runs at "
        "different max_num_seqs separate a step's fixed cost from its per-token cost); needs --out",
    )  # fmt: skip
    sim.add_argument("--name", default="calibrated", help="with --calibrate: the profile's name")
    sim.add_argument("--out", default=None, help="a folder for the simulation's files, or the profile file with --calibrate")
    sim.add_argument(
        "--core",
        choices=["auto", "compiled", "python"],
        default="auto",
        help="run the scheduler, KV manager and radix cache compiled with mypyc (built once, cached) or as "
        "Python; the same code and the same prediction (default: auto, compiled where mypy and a C compiler are)",
    )
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.set_defaults(func=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    try:
        if args.calibrate is not None:
            return _calibrate(args)
        if args.job is None:
            print("error: simulate: give a job file, or --calibrate RUN_DIR", file=sys.stderr)
            return 2
        return _simulate(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _calibrate(args: argparse.Namespace) -> int:
    from batchgen.sim.calibrate import calibrate, read_run
    from batchgen.sim.engine import load_sim_shape
    from batchgen.sim.hardware import write_hardware

    if args.out is None:
        print("error: simulate --calibrate: give --out PROFILE.yaml", file=sys.stderr)
        return 2
    runs = [read_run(Path(p)) for p in args.calibrate]
    run = runs[0]
    model_config = Path(args.model_config) if args.model_config else None
    try:
        shape = load_sim_shape(run.model, model_config=model_config)
    except FileNotFoundError as exc:  # the run's model is not here (a GPU run's was the device's)
        raise FileNotFoundError(f"{exc} (the run's model; give --model-config with its config.json)") from exc
    result = calibrate(runs, shape, name=args.name)
    p = result.profile
    comment = (
        f"Calibrated from {', '.join(str(r.source) for r in runs)} ({result.num_intervals} timeline intervals, R^2 {result.r_squared:.3f};\n"
        f"measured {result.measured_s:.2f} s, this profile predicts {result.predicted_s:.2f} s).\n"
        "Fitted: t = step_overhead_s*steps + seq_overhead_s*seqs + (flops + attention flops)/peak_flops\n"
        "  + bytes/memory_bandwidth\n"
        "(efficiencies 1, overlap false: the parts add; kv_cache_bytes is the run's KV pool)."
    )
    path = write_hardware(Path(args.out), p, comment=comment)
    print(
        f"{'profile':<28}{path}\n{'fit':<28}R^2 {result.r_squared:.3f} over {result.num_intervals} intervals, "
        f"{result.predicted_s:.2f} s predicted / {result.measured_s:.2f} s measured\n"
        f"{'step overhead':<28}{p.step_overhead_s * 1e3:.3f} ms (+ {p.seq_overhead_s * 1e6:.2f} us a sequence)\n"
        f"{'effective FLOP/s':<28}{p.peak_flops:.3e}\n"
        f"{'effective attention FLOP/s':<28}{p.attention_flops_per_s:.3e}\n"
        f"{'effective bytes/s':<28}{p.memory_bandwidth:.3e}"
    )
    return 0


def _token_source(args: argparse.Namespace, config: JobConfig, model: SimModel) -> tuple[TokenSource, str]:
    from batchgen.sim.lengths import (
        Filler,
        LengthDistribution,
        MaxTokens,
        RecordedOutputs,
        read_recorded_outputs,
        sharegpt_reply_lengths,
    )

    eos_ids = tuple(e for e in (*model.config.eos_token_ids, model.tokenizer.eos_token_id) if e is not None)
    filler = Filler.for_tokenizer(model.tokenizer, eos_ids)
    if args.outputs_from is not None:
        if not eos_ids:
            raise ValueError("the model has no EOS token: a replay cannot stop a sample early")
        folder = Path(args.outputs_from)
        shards = sorted(p for p in folder.glob("*.parquet") if p.name != "timeline.parquet" and not p.name.startswith("."))
        if not shards:
            raise FileNotFoundError(f"{folder}: no output shards (*.parquet) to replay")
        outputs = read_recorded_outputs(shards)
        return RecordedOutputs(outputs, filler=filler, eos=eos_ids[0]), f"recorded ({folder}, {len(outputs)} samples)"
    kind = args.output_lens or ("max-tokens" if config.sampling.ignore_eos else "sharegpt")
    if kind == "max-tokens" or not eos_ids:
        return MaxTokens(filler), "max_tokens"
    lengths = sharegpt_reply_lengths(model.tokenizer)
    return LengthDistribution(lengths, filler=filler, eos=eos_ids[0]), f"sharegpt reply lengths ({len(lengths)} replies)"


def core_cache_root() -> Path:
    """Where compiled cores are kept: `$XDG_CACHE_HOME/batchgen/core` (default ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "batchgen" / "core"


def _simulate(args: argparse.Namespace) -> int:
    # First: the compiled core replaces the Python modules only if none is imported yet.
    from batchgen.engine.compiled_core import CoreBuildError, enable_core

    try:
        core, why_not = enable_core(args.core, core_cache_root(), quiet=args.quiet)
    except CoreBuildError as exc:
        print(f"error: simulate --core compiled: {exc}", file=sys.stderr)
        return 2
    if why_not is not None:
        print(f"note: the engine core runs as Python ({why_not})", file=sys.stderr)

    from batchgen.io import InputError, JobFolder
    from batchgen.job.config import JobConfigError
    from batchgen.job.config_file import load_job_config
    from batchgen.sim.engine import load_sim_model
    from batchgen.sim.hardware import load_hardware
    from batchgen.sim.job import simulate_job, write_simulation

    try:
        config = load_job_config(Path(args.job), args.set or [])
    except JobConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print("error: simulate: --workers must be >= 1", file=sys.stderr)
        return 2
    hardware = load_hardware(args.hardware)
    model = load_sim_model(config.model, model_config=Path(args.model_config) if args.model_config else None)
    tokens, token_source = _token_source(args, config, model)
    try:
        result = simulate_job(
            config, model=model, hardware=hardware, tokens=tokens,
            token_source=token_source, workers=args.workers, use_tqdm=not args.quiet,
        )
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result.summary["simulated"]["engine_core"] = core
    print(summary_table(result.summary))
    if args.out is not None:
        out = write_simulation(result, Path(args.out))
        try:
            from batchgen.report import write_job_report

            print(f"{'report':<28}{write_job_report(JobFolder(out)).html}")
        except ImportError as exc:
            print(f"{'report':<28}not written ({exc.name or exc} is not installed)")
    return 0


def summary_table(d: dict[str, Any]) -> str:
    """The predicted figures, one a line."""
    s, t, rate = d["simulated"], d["tokens"], d["tokens_per_s"]
    hit, kv, rows = d["prefix_hit_rate"], d["kv_blocks"], d["rows"]
    lines = [
        f"{'hardware':<28}{s['hardware']['name']} ({s['hardware']['description']})",
        f"{'model':<28}{s['model']}",
        f"{'output lengths':<28}{s['output_lengths']}",
        f"{'predicted wall time':<28}{d['pipeline_s']:.1f} s (generation; model loading excluded)",
    ]
    if s["workers"]:
        finish = ", ".join(f"{w['finish_s']:.1f}" for w in s["per_worker"])
        lines.append(f"{'workers':<28}{s['workers']}: makespan {s['makespan_s']:.1f} s (each: {finish} s)")
    lines += [
        f"{'rows':<28}{rows['total']} ({', '.join(f'{k} {v}' for k, v in sorted(rows['by_status'].items())) or 'none'})",
        f"{'prompt tokens':<28}{t['prompt']} ({t['cached']} cached, {t['prefill_computed']} computed)",
        f"{'output tokens':<28}{t['output']}",
        f"{'output tokens/s':<28}{rate['output']:.1f}",
        f"{'total tokens/s':<28}{rate['total']:.1f}",
        f"{'peak KV blocks':<28}{kv['peak_used']} of {kv['total']}",
        f"{'preemptions':<28}{d['preemptions']}",
        f"{'prefix hit rate':<28}{hit['achieved']:.1%} (ideal {hit['ideal']:.1%})",
        f"{'simulated in':<28}{s['simulation_s']:.1f} s ({s['rows_per_s_simulated']:.0f} rows/s"
        f"{', compiled core' if s.get('engine_core') == 'compiled' else ''})",
    ]
    return "\n".join(lines)
