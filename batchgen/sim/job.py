"""`batchgen simulate job.yaml`: a job's real rows through its own pipeline on a simulated engine.

Owns the simulation of a job: its input shards are listed and read as a run reads them, each row
goes through the job's own prepare stage (template, tokenizer, length policy, seed) and window
ordering (`batchgen.job.pipeline`, unchanged), and the engine is the real `LLMEngine` with the
simulated runner and clock (`batchgen.sim.engine`). Output rows are counted by the pipeline's
write stage and dropped; nothing is written next to the inputs. With `workers`, shards go to
that many engines as the Ray driver hands them out (the first idle worker takes the next shard,
each worker's engine keeps its cache across its shards), and the makespan is the latest finish.

Writes, when asked (`write_simulation`): `summary.json` with the keys of a run's summary
(`pipeline_s`, `wall_s`: the predicted generation time, model loading excluded) plus
`simulated` (hardware, model, token source, cost by part, per-worker times), and
`timeline.parquet` of the simulated steps (one run per worker).

May import: batchgen.job, batchgen.engine, batchgen.io, batchgen.sim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchgen.engine.config import EngineConfigs
from batchgen.io import (
    TIMELINE_NAME,
    InputError,
    ShardInfo,
    find_input_shards,
    inspect_shard,
    write_json_atomic,
    write_parquet_atomic,
)
from batchgen.job.config import JobConfig
from batchgen.job.files import FileSource
from batchgen.job.openai_batch import OpenAIBatchSource, plan_openai_shards
from batchgen.job.pipeline import run_pipeline_sync
from batchgen.job.prepare import RowPreparer
from batchgen.job.prepare_stage import PrepareProcess, ProcessPreparer
from batchgen.job.run import pipeline_options
from batchgen.job.stages import PipelineStats, ShardMeta, ShardStats, Source
from batchgen.job.summary import make_summary
from batchgen.job.timeline_file import new_run_id, timeline_table
from batchgen.sim.engine import SimEngine, SimModel, build_sim_engine
from batchgen.sim.hardware import HardwareProfile
from batchgen.sim.lengths import TokenSource

__all__ = ["PREPARE_NICENESS", "SimulationResult", "simulate_job", "write_simulation"]

# The prepare process's niceness: the engine's steps are a simulation's critical path, and on a
# machine with fewer cores than busy threads (the engine, the event loop, the child's Python
# and its tokenizer's threads) they keep their core. 50,000 ShareGPT rows on 2 cores: 51.1 and
# 52.3 s at 10 against 67.8 and 68.4 s at 0, runs alternating; 5 gave 58.4 s and 19 53.3 s.
PREPARE_NICENESS = 10


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """The predicted summary (`summary.json`'s data) and the simulated timeline."""

    summary: dict[str, Any]
    timeline: pa.Table


class _DropSink:
    """Output rows are counted by the write stage, then dropped."""

    def write(self, shard: ShardMeta, rows: Sequence[Any]) -> None:
        return None

    def commit(self, shard: ShardMeta, stats: ShardStats) -> None:
        return None

    def discard(self, shard: ShardMeta) -> None:
        return None

    def abort(self) -> None:
        return None


def _shards(config: JobConfig) -> list[ShardMeta]:
    """The job's input shards in input order, as a run plans them (an unreadable one is an
    InputError here: a simulation has no bad-shard policy to apply)."""
    infos: list[ShardInfo]
    if config.io.input_format == "openai_jsonl":
        infos = plan_openai_shards(config)
    else:
        from batchgen.engine.sampling_params import SamplingParams

        names = [f.name for f in dataclasses.fields(SamplingParams)]
        infos = [
            inspect_shard(s.path, config.io.columns, name=s.name, partitions=s.partitions, sampling_fields=names)
            for s in find_input_shards(config.io.input, config.base_dir)
        ]
    return [
        ShardMeta(
            index=i,
            name=info.name,
            num_rows=info.num_rows,
            input_path=str(info.path),
            id_type=info.id_type,
            passthrough=info.passthrough,
            partitions=info.partitions,
            identity=info.identity(),
        )
        for i, info in enumerate(infos)
    ]


def _source(config: JobConfig) -> Source:
    if config.io.input_format == "openai_jsonl":
        return OpenAIBatchSource(config.io.batch_rows, config.io.max_line_bytes)
    return FileSource(config)


def _preparer(config: JobConfig, model: SimModel, sim: SimEngine, now: datetime) -> RowPreparer:
    return RowPreparer(
        model.tokenizer,
        config.sampling,
        max_model_len=sim.engine.max_model_len,
        prompt_too_long=config.prompt_too_long,
        job_seed=config.seed,
        now=now,
        vocab_size=model.config.vocab_size,
        chat=config.chat,
    )


def _add(total: PipelineStats, part: PipelineStats) -> None:
    """Fold one pipeline's statistics into the total (engine counters add, gauges max)."""
    total.num_rows += part.num_rows
    total.num_output_rows += part.num_output_rows
    total.rows_by_status.update(part.rows_by_status)
    total.error_codes.update(part.error_codes)
    total.prompt_tokens += part.prompt_tokens
    total.cached_tokens += part.cached_tokens
    total.output_tokens += part.output_tokens
    total.ideal_prefill_tokens += part.ideal_prefill_tokens
    total.committed_shards.extend(part.committed_shards)
    for key, value in part.engine.items():
        if key in ("num_kv_blocks", "peak_kv_blocks_used"):
            total.engine[key] = max(total.engine.get(key, 0), value)
        else:
            total.engine[key] = total.engine.get(key, 0) + value


def simulate_job(
    config: JobConfig,
    *,
    model: SimModel,
    hardware: HardwareProfile,
    tokens: TokenSource,
    token_source: str,
    workers: int | None = None,
    use_tqdm: bool = True,
    prepare_in_process: bool = True,
) -> SimulationResult:
    """Simulate the job on `hardware` (see the module docstring). `token_source` names how
    output lengths were chosen, for the summary. `prepare_in_process`: rows are prepared in a
    child process (`batchgen.job.prepare_stage`; the same rows as in a thread, without sharing
    the GIL with the engine's steps). Raises InputError for inputs that cannot be read and
    ValueError for engine settings that cannot work on this hardware."""
    started = time.perf_counter()
    if config.sampling.seed is not None:
        # One seed for every row draws the same noise; the simulation keys output lengths by
        # seed, so it gives each row its own (seeds never change the schedule).
        config = dataclasses.replace(config, sampling=config.sampling.replace(seed=None))
    shards = _shards(config)
    configs = EngineConfigs(config.scheduler, config.cache, config.runner)
    start = time.time()
    now = datetime.now().replace(microsecond=0)
    num_engines = 1 if workers is None else max(1, min(workers, len(shards)))
    try:
        sims = [
            build_sim_engine(
                model, configs, hardware, tokens, seed=config.seed,
                timeline_max_rows=config.timeline_rows, start_time=start,
            )
            for _ in range(num_engines)
        ]
    except ValueError as exc:
        raise ValueError(f"{config.source}: engine: {exc}") from exc
    preparers = [_preparer(config, model, sim, now) for sim in sims]
    options = dataclasses.replace(pipeline_options(config, use_tqdm=use_tqdm), wait_for_rows=True)
    source, sink = _source(config), _DropSink()
    total = PipelineStats()
    per_worker: list[dict[str, Any]] = [{"shards": 0, "rows": 0} for _ in sims]
    with contextlib.ExitStack() as stack:
        process = (
            stack.enter_context(PrepareProcess(preparers, options.columns, niceness=PREPARE_NICENESS))
            if prepare_in_process
            else None
        )

        def remote(w: int) -> ProcessPreparer | None:
            return None if process is None else ProcessPreparer(process, w)

        if workers is None:
            _add(total, run_pipeline_sync(sims[0].engine, preparers[0], source, sink, shards, options, remote(0)))
        else:
            for shard in shards:
                # The driver's dispatch: the worker idle first (ties: the lower slot) takes the next.
                w = min(range(len(sims)), key=lambda i: (sims[i].clock.now(), i))
                _add(total, run_pipeline_sync(sims[w].engine, preparers[w], source, sink, [shard], options, remote(w)))
                per_worker[w]["shards"] += 1
                per_worker[w]["rows"] += shard.num_rows
    predicted = max(sim.clock.now() for sim in sims) - start
    total.wall_s = predicted
    summary = make_summary(
        total,
        predicted,
        skipped=0,
        bad_shards={},
        duplicate_ids=sum(p.num_duplicate_ids_across_shards for p in preparers),
        ids_tracked=sum(p.num_ids_tracked for p in preparers),
        duplicates_checked=workers is None,
    ).data
    real_s = time.perf_counter() - started
    run_id = f"sim-{new_run_id()}"
    summary["run"] = {
        "run_id": run_id,
        "run_index": 0,
        "model": config.model or "built-in SmolLM2-135M-Instruct",
        "config": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
        "engine": {
            "device": f"simulated {hardware.name}",
            "dtype": f"{hardware.dtype_bytes}-byte",
            "num_kv_blocks": sims[0].engine.kv.num_blocks,
        },
    }
    for i, sim in enumerate(sims):
        per_worker[i].update(finish_s=round(sim.clock.now() - start, 6), **sim.runner.totals.as_dict())
    summary["simulated"] = {
        "hardware": hardware.as_dict(),
        "model": model.source,
        "model_shape": dataclasses.asdict(model.shape),
        "output_lengths": token_source,
        "workers": workers,
        "makespan_s": round(predicted, 6),
        "per_worker": per_worker,
        "simulation_s": round(real_s, 3),
        "rows_per_s_simulated": round(total.num_rows / real_s, 1) if real_s > 0 else 0.0,
    }
    tables = [
        timeline_table(sim.engine.timeline.rows(), run_id=f"{run_id}-w{i}" if workers else run_id, run_index=i)
        for i, sim in enumerate(sims)
    ]
    return SimulationResult(summary, pa.concat_tables(tables))


def write_simulation(result: SimulationResult, out_dir: Path) -> Path:
    """Write `summary.json` and `timeline.parquet` into `out_dir` (created). Raises OSError,
    InputError when `out_dir` is a file."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir} is not a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "summary.json", result.summary)
    write_parquet_atomic(out_dir / TIMELINE_NAME, result.timeline)
    return out_dir

