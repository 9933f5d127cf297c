"""`batchgen run job.yaml`: validate everything, resume, run the pipeline over files, summarize.

Exactly-once: an output shard exists whole or not at all (temporary file, fsync, rename). The
output file is the truth; the manifest records the configuration fingerprint and per-shard
figures. A run killed after a rename but before the manifest save is reconciled on the next run
by reading the committed file back (`batchgen.job.resume`).

Setup (exit code 2 in the CLI: `InputError`, `ConfigChangedError`) happens before anything in
the output folder changes: inputs listed and checked, the output folder checked to lie outside
the input set, then locked for the whole run (`OutputLock`), the device and the model checked
and loaded, the manifest opened. Failures after that are `JobError` (exit code 1), with the
uncommitted outputs removed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchgen import __version__
from batchgen.engine.llm_engine import LLMEngine
from batchgen.io import (
    InputError,
    InputIdentity,
    Manifest,
    OutputLock,
    OutputRow,
    OutputShardWriter,
    ShardInfo,
    ShardReadError,
    check_output_dir,
    check_output_outside_inputs,
    clean_temp_files,
    inspect_shard,
    iter_shard_batches,
    list_input_shards,
    output_schema,
    rows_to_batch,
    shard_metadata,
    summarize_output_shard,
    write_json_atomic,
)
from batchgen.job.config import JobConfig
from batchgen.job.pipeline import run_pipeline_sync
from batchgen.job.prepare import MAX_TRACKED_IDS, RowPreparer
from batchgen.job.resume import ConfigChangedError, bad_shard, open_manifest, plan_resume
from batchgen.job.setup import check_device, load_model
from batchgen.job.shard_assembly import achieved_hit_rate, ideal_hit_rate
from batchgen.job.stages import JobError, PipelineOptions, PipelineStats, ShardMeta, ShardStats
from batchgen.models.checkpoint import Checkpoint

__all__ = ["ConfigChangedError", "JobSummary", "build_engine", "run_job"]


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
        if d["bad_shards"]:
            lines.append(f"{'bad shards (skipped)':<28}{', '.join(sorted(d['bad_shards']))}")
        if d["rows"]["duplicate_ids_across_shards"]:
            lines.append(f"{'ids repeated across shards':<28}{d['rows']['duplicate_ids_across_shards']}")
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
    """The job's engine. Raises InputError naming the job file's `engine` section when the
    engine cannot be built from these settings (sizes, memory, device)."""
    try:
        return LLMEngine(
            checkpoint,
            scheduler_config=config.scheduler,
            cache_config=config.cache,
            runner_config=config.runner,
            seed=config.seed,
        )
    except (ValueError, RuntimeError) as exc:
        raise InputError(f"{config.source}: engine: {exc}") from exc


class _FileSource:
    def __init__(self, config: JobConfig) -> None:
        self._columns = config.io.columns
        self._batch_rows = config.io.batch_rows

    def iter_batches(self, shard: ShardMeta) -> Iterator[pa.RecordBatch]:
        batches: Iterator[pa.RecordBatch] = iter_shard_batches(
            Path(shard.input_path), self._columns, self._batch_rows
        )
        return batches


class _FileSink:
    """Output shards as files. Each file carries the fingerprint's digest and its input's
    identity in its Parquet metadata. An OSError (disk full, ...) becomes a JobError naming the
    file; the pipeline then aborts every uncommitted shard."""

    def __init__(
        self,
        out_dir: Path,
        manifest: Manifest,
        config: JobConfig,
        fingerprint: Mapping[str, Any],
        identities: Mapping[str, InputIdentity],
    ) -> None:
        self._out_dir = out_dir
        self._manifest = manifest
        self._config = config
        self._fingerprint = fingerprint
        self._identities = identities
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
            ).with_metadata(shard_metadata(self._fingerprint, self._identities[shard.name]))
            self._schemas[shard.index] = schema
            writer = OutputShardWriter(self._out_dir, shard.name, schema)
            self._writers[shard.index] = writer
        return writer

    def write(self, shard: ShardMeta, rows: Sequence[OutputRow]) -> None:
        try:
            writer = self._writer(shard)
            writer.write(rows_to_batch(rows, self._schemas[shard.index]))
        except OSError as exc:
            raise JobError(f"{self._out_dir / shard.name}: cannot write the output shard: {exc}") from exc

    def commit(self, shard: ShardMeta, stats: ShardStats) -> None:
        try:
            writer = self._writer(shard)
            path = writer.commit()
            del self._writers[shard.index]
            # The record comes from the committed file, exactly as a resumed run rebuilds it
            # for a shard whose manifest save was lost (ShardRecord counts over output rows).
            record = summarize_output_shard(path, input=self._identities[shard.name])
            self._manifest.mark_committed(
                shard.name,
                dataclasses.replace(record, wall_s=round(time.perf_counter() - stats.started, 3)),
            )
        except OSError as exc:
            raise JobError(f"{self._out_dir / shard.name}: cannot commit the output shard: {exc}") from exc

    def discard(self, shard: ShardMeta) -> None:
        writer = self._writers.pop(shard.index, None)
        if writer is not None:
            writer.abort()

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


def _plan_shards(config: JobConfig) -> tuple[list[Path], list[ShardInfo], dict[str, Path]]:
    """All input paths, the readable shards' infos, and (under ``on_bad_shard: skip``) the
    shards whose footer cannot be read, by name. Schema problems always raise InputError."""
    paths = list_input_shards(config.io.input, config.base_dir)
    infos: list[ShardInfo] = []
    unreadable: dict[str, Path] = {}
    for path in paths:
        try:
            infos.append(inspect_shard(path, config.io.columns))
        except ShardReadError:
            if config.on_bad_shard != "skip":
                raise
            unreadable[path.name] = path
    return paths, infos, unreadable


def run_job(config: JobConfig, *, restart: bool = False, use_tqdm: bool = True) -> JobSummary:
    """Run (or resume) the job. Raises InputError / ConfigChangedError for setup problems
    (nothing in the output folder changed), JobError for a failure while running (nothing
    partial committed); other exceptions are bugs."""
    start = time.perf_counter()
    paths, infos, unreadable = _plan_shards(config)  # every input checked before any work
    out_dir = config.resolve_path(config.io.output)
    check_output_outside_inputs(out_dir, config.io.input, config.base_dir, paths)
    check_output_dir(out_dir)
    with OutputLock(out_dir):
        return _run_locked(config, out_dir, infos, unreadable, restart, use_tqdm, start)


def _run_locked(
    config: JobConfig,
    out_dir: Path,
    infos: list[ShardInfo],
    unreadable: dict[str, Path],
    restart: bool,
    use_tqdm: bool,
    start: float,
) -> JobSummary:
    check_device(config)
    checkpoint = load_model(config)
    fingerprint = _fingerprint(config, checkpoint)
    names = sorted([info.name for info in infos] + list(unreadable))
    try:
        manifest = open_manifest(
            out_dir,
            fingerprint,
            names,
            restart=restart,
            job_time=datetime.now().replace(microsecond=0).isoformat(),
        )
        clean_temp_files(out_dir)
        plan = plan_resume(out_dir, manifest, fingerprint, infos, list(unreadable))
        for name, path in unreadable.items():
            manifest.mark_bad(name, bad_shard(path, f"{path}: unreadable Parquet footer"))
    except OSError as exc:
        raise InputError(f"output folder {out_dir}: {exc}") from exc
    todo = [
        ShardMeta(
            index=i,
            name=info.name,
            num_rows=info.num_rows,
            input_path=str(info.path),
            id_type=info.id_type,
            passthrough=info.passthrough,
        )
        for i, info in enumerate(plan.todo)
    ]
    engine = build_engine(config, checkpoint)
    preparer = RowPreparer(
        checkpoint.tokenizer,
        config.sampling,
        max_model_len=engine.max_model_len,
        prompt_too_long=config.prompt_too_long,
        job_seed=config.seed,
        now=datetime.fromisoformat(manifest.job_time),
    )
    options = PipelineOptions(
        columns=config.io.columns,
        batch_rows=config.io.batch_rows,
        order=config.order,
        window_rows=config.window_rows,
        max_error_rate=config.max_error_rate,
        min_rows_for_error_rate=config.min_rows_for_error_rate,
        include_token_ids=config.io.include_token_ids,
        include_logprobs=config.io.include_logprobs,
        use_tqdm=use_tqdm,
        on_bad_shard=config.on_bad_shard,
    )
    identities = {info.name: info.identity() for info in plan.todo}
    sink = _FileSink(out_dir, manifest, config, fingerprint, identities)
    stats = run_pipeline_sync(engine, preparer, _FileSource(config), sink, todo, options)
    by_name = {info.name: info for info in plan.todo}
    try:
        for name, error in stats.bad_shards.items():
            manifest.mark_bad(name, bad_shard(by_name[name], error))
        recorded = manifest.bad_shards()
        bad = {**plan.known_bad, **{n: recorded[n].error for n in unreadable}, **stats.bad_shards}
        summary = make_summary(
            stats,
            time.perf_counter() - start,
            skipped=len(plan.skipped),
            bad_shards=bad,
            duplicate_ids=preparer.num_duplicate_ids_across_shards,
            ids_tracked=preparer.num_ids_tracked,
        )
        write_json_atomic(out_dir / "summary.json", summary.data)
    except OSError as exc:
        raise JobError(f"output folder {out_dir}: {exc}") from exc
    return summary


def make_summary(
    stats: PipelineStats,
    wall_s: float,
    *,
    skipped: int,
    bad_shards: Mapping[str, str],
    duplicate_ids: int,
    ids_tracked: int,
) -> JobSummary:
    """The run's figures. `bad_shards` (name -> error) are the shards skipped as unreadable,
    this run or before; `duplicate_ids` counts rows whose id another shard of this run already
    had, checked over the first `ids_tracked` distinct ids (complete below MAX_TRACKED_IDS)."""
    engine = stats.engine
    prompt = engine.get("prompt_tokens", 0)
    output = engine.get("generation_tokens", 0)
    return JobSummary(
        {
            "wall_s": round(wall_s, 3),
            "pipeline_s": round(stats.wall_s, 3),
            "shards": {"committed_this_run": len(stats.committed_shards), "skipped": skipped},
            "bad_shards": dict(sorted(bad_shards.items())),
            "rows": {
                "total": stats.num_rows,
                "output_rows": stats.num_output_rows,
                "by_status": dict(stats.rows_by_status),
                "error_codes": dict(stats.error_codes),
                "duplicate_ids_across_shards": duplicate_ids,
                "duplicate_id_check": {
                    "ids_tracked": ids_tracked,
                    "complete": ids_tracked < MAX_TRACKED_IDS,
                },
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
