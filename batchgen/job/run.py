"""`batchgen run job.yaml`: validate everything, resume, run the pipeline over files, summarize.

Exactly-once: an output shard exists whole or not at all (temporary file, fsync, rename). The
output file is the truth; the manifest records the configuration fingerprint and per-shard
figures. A run killed after a rename but before the manifest save is reconciled on the next run
by reading the committed file back.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchgen import __version__
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.io import (
    InputError,
    Manifest,
    OutputRow,
    OutputShardWriter,
    check_output_dir,
    clean_temp_files,
    find_input_shards,
    inspect_shard,
    iter_shard_batches,
    output_schema,
    rows_to_batch,
    summarize_output_shard,
    write_json_atomic,
)
from batchgen.io.jsonl_writer import summarize_openai_output
from batchgen.job.config import JobConfig
from batchgen.job.openai_batch import OpenAIBatchSink, OpenAIBatchSource, plan_openai_shards
from batchgen.job.pipeline import run_pipeline_sync
from batchgen.job.prepare import RowPreparer
from batchgen.job.shard_assembly import achieved_hit_rate, ideal_hit_rate
from batchgen.job.stages import (
    JobError,
    PipelineOptions,
    PipelineStats,
    ShardMeta,
    ShardStats,
    Sink,
    Source,
)
from batchgen.models.checkpoint import Checkpoint, load_checkpoint

__all__ = ["ConfigChangedError", "JobSummary", "build_engine", "run_job"]


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


class _FileSource:
    def __init__(self, config: JobConfig, partitions: dict[str, tuple[tuple[str, str], ...]]) -> None:
        self._columns = config.io.columns
        self._batch_rows = config.io.batch_rows
        self._partitions = partitions  # input path -> Hive partition values

    def iter_batches(self, shard: ShardMeta) -> Iterator[pa.RecordBatch]:
        batches: Iterator[pa.RecordBatch] = iter_shard_batches(
            Path(shard.input_path),
            self._columns,
            self._batch_rows,
            partitions=self._partitions.get(shard.input_path, ()),
        )
        return batches


class _FileSink:
    def __init__(self, out_dir: Path, manifest: Manifest, config: JobConfig) -> None:
        self._out_dir = out_dir
        self._manifest = manifest
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
        self._manifest.mark_committed(
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
    if config.io.input_format == "openai_jsonl":
        return plan_openai_shards(config)
    out_dir = config.resolve_path(config.io.output)  # inside the input folder: not input
    sampling_fields = [f.name for f in dataclasses.fields(SamplingParams)]
    return [
        (
            s.path,
            inspect_shard(
                s.path, config.io.columns, name=s.name, partitions=s.partitions, sampling_fields=sampling_fields
            ),
        )
        for s in find_input_shards(config.io.input, config.base_dir, exclude=out_dir)
    ]


def _summarize(config: JobConfig, path: Path, *, input_path: str, num_input_rows: int) -> Any:
    summarize = summarize_openai_output if config.io.output_format == "openai_jsonl" else summarize_output_shard
    return summarize(path, input_path=input_path, num_input_rows=num_input_rows)


def _source_and_sink(
    config: JobConfig, infos: list[tuple[Path, Any]], out_dir: Path, manifest: Manifest, checkpoint: Checkpoint
) -> tuple[Source, Sink]:
    """Parquet files, or OpenAI batch request/response files (`batchgen.job.openai_batch`)."""
    source: Source
    sink: Sink
    if config.io.input_format == "openai_jsonl":
        source = OpenAIBatchSource(config.io.batch_rows)
    else:
        source = _FileSource(config, {str(path): info.partitions for path, info in infos})
    if config.io.output_format == "openai_jsonl":
        served = checkpoint.source.name
        sink = OpenAIBatchSink(out_dir, manifest, checkpoint.tokenizer, served)
    else:
        sink = _FileSink(out_dir, manifest, config)
    return source, sink


def run_job(config: JobConfig, *, restart: bool = False, use_tqdm: bool = True) -> JobSummary:
    """Raises InputError / JobError with a message for the user; other exceptions are bugs."""
    start = time.perf_counter()
    infos = _plan_shards(config)  # every input checked before any work
    out_dir = config.resolve_path(config.io.output)
    check_output_dir(out_dir)
    if config.model is not None and not config.resolve_path(config.model).exists():
        raise InputError(f"{config.source}: model: {config.resolve_path(config.model)} does not exist")
    model = str(config.resolve_path(config.model)) if config.model is not None else None
    try:
        checkpoint = load_checkpoint(model)
    except (FileNotFoundError, ValueError) as exc:
        raise InputError(f"{config.source}: model: {exc}") from exc
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
        if (out_dir / info.name).exists():
            # Killed after the rename, before the manifest save: the file is whole; record it.
            record = _summarize(config, out_dir / info.name, input_path=str(path), num_input_rows=info.num_rows)
            manifest.mark_committed(info.name, record)
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
    is_openai = config.io.output_format == "openai_jsonl"
    options = PipelineOptions(
        columns=config.io.columns,
        batch_rows=config.io.batch_rows,
        order=config.order,
        window_rows=config.window_rows,
        max_error_rate=config.max_error_rate,
        min_rows_for_error_rate=config.min_rows_for_error_rate,
        include_token_ids=config.io.include_token_ids or is_openai,
        include_logprobs=config.io.include_logprobs or is_openai,
        use_tqdm=use_tqdm,
    )
    source, sink = _source_and_sink(config, infos, out_dir, manifest, checkpoint)
    stats = run_pipeline_sync(engine, preparer, source, sink, todo, options)
    summary = make_summary(stats, time.perf_counter() - start, skipped=skipped)
    write_json_atomic(out_dir / "summary.json", summary.data)
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
