"""`batchgen run job.yaml`: validate everything, resume, run the pipeline over files, summarize.

Exactly-once: an output shard exists whole or not at all (temporary file, fsync, rename). The
output file is the truth; the manifest records the configuration fingerprint and per-shard
figures. A run killed after a rename but before the manifest save is reconciled on the next run
by reading the committed file back.

Planning (`plan_job`), the engine setup and the file source/sink are shared with the Ray
executor (batchgen.ray), whose workers commit shards through `FileSink` and whose driver records
them in the manifest.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchgen import __version__
from batchgen.engine.llm_engine import LLMEngine
from batchgen.io import (
    InputError,
    Manifest,
    OutputRow,
    OutputShardWriter,
    ShardRecord,
    check_output_dir,
    clean_temp_files,
    inspect_shard,
    iter_shard_batches,
    list_input_shards,
    output_schema,
    rows_to_batch,
    summarize_output_shard,
    write_json_atomic,
)
from batchgen.job.config import JobConfig
from batchgen.job.pipeline import run_pipeline_sync
from batchgen.job.prepare import RowPreparer
from batchgen.job.shard_assembly import achieved_hit_rate, ideal_hit_rate
from batchgen.job.stages import JobError, PipelineOptions, PipelineStats, ShardMeta, ShardStats
from batchgen.models.checkpoint import Checkpoint, load_checkpoint

__all__ = [
    "ConfigChangedError",
    "FileSink",
    "FileSource",
    "JobPlan",
    "JobSummary",
    "build_engine",
    "build_job_engine",
    "load_job_checkpoint",
    "make_summary",
    "pipeline_options",
    "plan_job",
    "reconcile_shard",
    "run_job",
]


class ConfigChangedError(JobError):
    """The output folder belongs to another configuration (resume refused)."""


@dataclass(frozen=True, slots=True)
class JobSummary:
    data: dict[str, Any]

    def table(self) -> str:
        d = self.data
        lines = [
            f"{'wall time':<28}{d['wall_s']:.1f} s",
            f"{'shards':<28}{d['shards']['committed_this_run']} committed, {d['shards']['skipped']} already done",
            f"{'rows':<28}{d['rows']['total']} ({', '.join(f'{k} {v}' for k, v in sorted(d['rows']['by_status'].items())) or 'none'})",
        ]
        if d["rows"]["error_codes"]:
            codes = ", ".join(f"{k} {v}" for k, v in sorted(d["rows"]["error_codes"].items()))
            lines.append(f"{'errors by code':<28}{codes}")
        t = d["tokens"]
        lines += [
            f"{'prompt tokens':<28}{t['prompt']}",
            f"{'cached prompt tokens':<28}{t['cached']}",
            f"{'prefill tokens computed':<28}{t['prefill_computed']}",
            f"{'output tokens':<28}{t['output']}",
            f"{'output tokens/s':<28}{d['tokens_per_s']['output']:.1f}",
            f"{'total tokens/s':<28}{d['tokens_per_s']['total']:.1f}",
            f"{'preemptions':<28}{d['preemptions']}",
            f"{'prefix hit rate':<28}{d['prefix_hit_rate']['achieved']:.1%} (ideal {d['prefix_hit_rate']['ideal']:.1%})",
        ]
        return "\n".join(lines)


def build_engine(config: JobConfig, checkpoint: Checkpoint) -> LLMEngine:
    return LLMEngine(
        checkpoint,
        scheduler_config=config.scheduler,
        cache_config=config.cache,
        runner_config=config.runner,
        seed=config.seed,
    )


class FileSource:
    """Reads a job's input shards (the configured columns, `input.batch_rows` at a time)."""

    def __init__(self, config: JobConfig) -> None:
        self._columns = config.io.columns
        self._batch_rows = config.io.batch_rows

    def iter_batches(self, shard: ShardMeta) -> Iterator[pa.RecordBatch]:
        batches: Iterator[pa.RecordBatch] = iter_shard_batches(
            Path(shard.input_path), self._columns, self._batch_rows
        )
        return batches


class FileSink:
    """Writes output shards into `out_dir` (temporary file, fsync, rename) and hands each
    committed shard's record to `on_commit` (the local run records it in the manifest; a Ray
    worker returns it to the driver, the manifest's only writer)."""

    def __init__(
        self, out_dir: Path, config: JobConfig, on_commit: Callable[[str, ShardRecord], None]
    ) -> None:
        self._out_dir = out_dir
        self._on_commit = on_commit
        self._config = config
        self._writers: dict[int, OutputShardWriter] = {}
        self._schemas: dict[int, pa.Schema] = {}

    def _writer(self, shard: ShardMeta) -> OutputShardWriter:
        writer = self._writers.get(shard.index)
        if writer is None:
            schema = output_schema(
                shard.id_type,
                shard.passthrough,
                with_token_ids=self._config.io.include_token_ids,
                with_logprobs=self._config.io.include_logprobs,
            )
            self._schemas[shard.index] = schema
            writer = OutputShardWriter(self._out_dir, shard.name, schema)
            self._writers[shard.index] = writer
        return writer

    def write(self, shard: ShardMeta, rows: Sequence[OutputRow]) -> None:
        writer = self._writer(shard)
        writer.write(rows_to_batch(rows, self._schemas[shard.index]))

    def commit(self, shard: ShardMeta, stats: ShardStats) -> None:
        writer = self._writer(shard)
        path = writer.commit()
        del self._writers[shard.index]
        # The record comes from the committed file, exactly as a resumed run rebuilds it for a
        # shard whose manifest save was lost (ShardRecord counts over output rows).
        record = summarize_output_shard(
            path, input_path=shard.input_path, num_input_rows=shard.num_rows
        )
        self._on_commit(
            shard.name,
            dataclasses.replace(record, wall_s=round(time.perf_counter() - stats.started, 3)),
        )

    def abort(self) -> None:
        for writer in self._writers.values():
            writer.abort()
        self._writers.clear()


def _fingerprint(config: JobConfig, checkpoint: Checkpoint) -> dict[str, Any]:
    tok = checkpoint.tokenizer
    return {
        "batchgen_version": __version__,
        "job": config.fingerprint_fields(),
        "model": {"fingerprint": checkpoint.fingerprint},
        "tokenizer": {"fingerprint": tok.fingerprint},
    }


def _plan_shards(config: JobConfig) -> list[tuple[Path, Any]]:
    paths = list_input_shards(config.io.input, config.base_dir)
    return [(p, inspect_shard(p, config.io.columns)) for p in paths]


@dataclass(slots=True)
class JobPlan:
    """A planned job: the output folder, its manifest (already reconciled with the files on
    disk), the loaded checkpoint and the input shards still to generate, in input order."""

    out_dir: Path
    manifest: Manifest
    checkpoint: Checkpoint
    todo: list[ShardMeta]
    skipped: int


def load_job_checkpoint(config: JobConfig) -> Checkpoint:
    """The job's model. Raises InputError naming the job file when it is missing or unusable."""
    if config.model is not None and not config.resolve_path(config.model).exists():
        raise InputError(f"{config.source}: model: {config.resolve_path(config.model)} does not exist")
    model = str(config.resolve_path(config.model)) if config.model is not None else None
    try:
        return load_checkpoint(model)
    except (FileNotFoundError, ValueError) as exc:
        raise InputError(f"{config.source}: model: {exc}") from exc


def reconcile_shard(manifest: Manifest, out_dir: Path, name: str, input_path: str, num_rows: int) -> bool:
    """Record shard `name` if its output file exists but the manifest lacks it (renamed, then
    killed before the save); True when the file exists (the shard is done, never written twice)."""
    path = out_dir / name
    if not path.exists():
        return False
    if name not in manifest.committed():
        manifest.mark_committed(
            name, summarize_output_shard(path, input_path=input_path, num_input_rows=num_rows)
        )
    return True


def plan_job(config: JobConfig, *, restart: bool = False) -> JobPlan:
    """Check every input, the output folder and the model; load or create the manifest
    (refusing a changed configuration unless `restart`), clean temporary files and find the
    shards still to do. Raises InputError / ConfigChangedError with a message for the user."""
    infos = _plan_shards(config)  # every input checked before any work
    out_dir = config.resolve_path(config.io.output)
    check_output_dir(out_dir)
    checkpoint = load_job_checkpoint(config)
    fingerprint = _fingerprint(config, checkpoint)

    manifest = Manifest.load(out_dir)
    names = [info.name for _, info in infos]
    if manifest is not None and not restart:
        changes = manifest.diff_fingerprint(fingerprint)
        if changes:
            raise ConfigChangedError(
                f"{out_dir / 'manifest.json'} was written by a different configuration:\n  "
                + "\n  ".join(changes)
                + "\nrun with --restart to discard the existing outputs, or use another output folder"
            )
    elif manifest is None and not restart:
        existing = [n for n in names if (out_dir / n).exists()]
        if existing:
            raise ConfigChangedError(
                f"{out_dir} already holds {', '.join(existing[:3])} but no manifest.json; "
                "run with --restart to overwrite, or use another output folder"
            )
    if manifest is None or restart:
        for name in names:
            (out_dir / name).unlink(missing_ok=True)
        manifest = Manifest.create(out_dir, fingerprint)
    clean_temp_files(out_dir)

    done = manifest.committed()
    todo: list[ShardMeta] = []
    skipped = 0
    for path, info in infos:
        if info.name in done and (out_dir / info.name).is_file():
            # A committed shard whose file is gone (a --restart killed while deleting, a
            # hand-deleted file) is generated again, never silently skipped.
            skipped += 1
            continue
        # Killed after the rename, before the manifest save: the file is whole; record it.
        if reconcile_shard(manifest, out_dir, info.name, str(path), info.num_rows):
            skipped += 1
            continue
        todo.append(
            ShardMeta(
                index=len(todo),
                name=info.name,
                num_rows=info.num_rows,
                input_path=str(path),
                id_type=info.id_type,
                passthrough=info.passthrough,
            )
        )
    return JobPlan(out_dir, manifest, checkpoint, todo, skipped)


def build_job_engine(config: JobConfig, checkpoint: Checkpoint) -> tuple[LLMEngine, RowPreparer]:
    """The engine and row preparer of a job. Raises InputError naming the job file when the
    engine settings do not fit the model or the device."""
    try:
        engine = build_engine(config, checkpoint)
    except ValueError as exc:
        raise InputError(f"{config.source}: engine: {exc}") from exc
    preparer = RowPreparer(
        checkpoint.tokenizer,
        config.sampling,
        max_model_len=engine.max_model_len,
        prompt_too_long=config.prompt_too_long,
        job_seed=config.seed,
    )
    return engine, preparer


def pipeline_options(config: JobConfig, *, use_tqdm: bool) -> PipelineOptions:
    """The pipeline's options from the job file."""
    return PipelineOptions(
        columns=config.io.columns,
        batch_rows=config.io.batch_rows,
        order=config.order,
        window_rows=config.window_rows,
        max_error_rate=config.max_error_rate,
        min_rows_for_error_rate=config.min_rows_for_error_rate,
        include_token_ids=config.io.include_token_ids,
        include_logprobs=config.io.include_logprobs,
        use_tqdm=use_tqdm,
    )


def run_job(config: JobConfig, *, restart: bool = False, use_tqdm: bool = True) -> JobSummary:
    """Raises InputError / JobError with a message for the user; other exceptions are bugs."""
    start = time.perf_counter()
    plan = plan_job(config, restart=restart)
    engine, preparer = build_job_engine(config, plan.checkpoint)
    sink = FileSink(plan.out_dir, config, plan.manifest.mark_committed)
    options = pipeline_options(config, use_tqdm=use_tqdm)
    stats = run_pipeline_sync(engine, preparer, FileSource(config), sink, plan.todo, options)
    summary = make_summary(stats, time.perf_counter() - start, skipped=plan.skipped)
    write_json_atomic(plan.out_dir / "summary.json", summary.data)
    return summary


def make_summary(stats: PipelineStats, wall_s: float, *, skipped: int) -> JobSummary:
    engine = stats.engine
    prompt = engine.get("prompt_tokens", 0)
    output = engine.get("generation_tokens", 0)
    return JobSummary(
        {
            "wall_s": round(wall_s, 3),
            "pipeline_s": round(stats.wall_s, 3),
            "shards": {"committed_this_run": len(stats.committed_shards), "skipped": skipped},
            "rows": {
                "total": stats.num_rows,
                "output_rows": stats.num_output_rows,
                "by_status": dict(stats.rows_by_status),
                "error_codes": dict(stats.error_codes),
            },
            "tokens": {
                "prompt": stats.prompt_tokens,
                "cached": stats.cached_tokens,
                "prefill_computed": engine.get("prefill_tokens_computed", 0),
                "output": stats.output_tokens,
            },
            "tokens_per_s": {
                "output": output / stats.wall_s if stats.wall_s else 0.0,
                "total": (output + prompt) / stats.wall_s if stats.wall_s else 0.0,
            },
            "preemptions": engine.get("num_preemptions", 0),
            "prefix_hit_rate": {"achieved": achieved_hit_rate(stats), "ideal": ideal_hit_rate(stats)},
            "kv_blocks": {
                "total": engine.get("num_kv_blocks", 0),
                "peak_used": engine.get("peak_kv_blocks_used", 0),
            },
        }
    )
