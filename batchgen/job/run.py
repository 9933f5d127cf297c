"""`batchgen run job.yaml`: validate everything, resume, run the pipeline over files, summarize.

Exactly-once: an output shard exists whole or not at all (temporary file, fsync, rename). The
output file is the truth; the manifest records the configuration fingerprint and per-shard
figures. A run killed after a rename but before the manifest save is reconciled on the next run
by reading the committed file back (`batchgen.job.resume`).

Setup (exit code 2 in the CLI: `InputError`, `ConfigChangedError`) happens before anything in
the output folder changes: inputs listed and checked, the output folder checked to lie outside
the input set, then locked for the whole run (`OutputLock`), the device and the model checked
and loaded, a job-level `sampling.structured_outputs` compiled, the manifest opened. Failures after that are `JobError` (exit code 1), with the
uncommitted outputs removed.

Planning (`planned_job`), the engine setup and the file source/sink (`batchgen.job.files`) are
shared with the Ray executor (`batchgen.ray`), whose workers commit shards through `FileSink` and
whose driver, under the same lock, records them in the manifest.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from batchgen import __version__
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.io import (
    InputError,
    InputIdentity,
    JobFolder,
    Manifest,
    OutputLock,
    ShardInfo,
    ShardReadError,
    ShardRecord,
    check_output_dir,
    check_output_outside_inputs,
    clean_temp_files,
    find_input_shards,
    inspect_shard,
    write_json_atomic,
)
from batchgen.job.config import JobConfig
from batchgen.job.files import FileSink, FileSource
from batchgen.job.openai_batch import (
    OpenAIBatchSink,
    OpenAIBatchSource,
    check_output_files_not_inputs,
    plan_openai_shards,
)
from batchgen.job.pipeline import run_pipeline_sync
from batchgen.job.prepare import RowPreparer
from batchgen.job.resume import ConfigChangedError, bad_shard, open_manifest, plan_resume
from batchgen.job.setup import check_device, load_model
from batchgen.job.stages import JobError, PipelineOptions, ShardMeta, Sink, Source
from batchgen.job.structured_rows import check_job_structured_outputs
from batchgen.job.summary import JobSummary, make_summary
from batchgen.job.timeline_file import TimelineFile, describe_environment, new_run_id
from batchgen.models.checkpoint import Checkpoint

__all__ = [
    "ConfigChangedError",
    "JobPlan",
    "JobSummary",
    "build_engine",
    "build_job_engine",
    "job_fingerprint",
    "job_folder",
    "make_summary",
    "pipeline_options",
    "planned_job",
    "run_job",
    "source_and_sink",
]


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
            timeline_max_rows=config.timeline_rows,
        )
    except (ValueError, RuntimeError) as exc:
        raise InputError(f"{config.source}: engine: {exc}") from exc


def job_fingerprint(config: JobConfig, checkpoint: Checkpoint) -> dict[str, Any]:
    """What the manifest and every output file record of the configuration."""
    tok = checkpoint.tokenizer
    return {
        "batchgen_version": __version__,
        "job": config.fingerprint_fields(),
        "model": {"fingerprint": checkpoint.fingerprint},
        "tokenizer": {"fingerprint": tok.fingerprint},
    }


def _plan_shards(config: JobConfig) -> tuple[list[Path], list[ShardInfo], dict[str, Path]]:
    """All input paths, the readable shards' infos, and (under ``on_bad_shard: skip``) the
    shards whose footer cannot be read, by name. Schema problems always raise InputError.
    Parquet inputs are found by `find_input_shards` (folders recursively, Hive partitions);
    OpenAI batch request files by `plan_openai_shards`."""
    if config.io.input_format == "openai_jsonl":
        openai_infos = plan_openai_shards(config)
        return [info.path for info in openai_infos], openai_infos, {}
    sampling_fields = [f.name for f in dataclasses.fields(SamplingParams)]
    paths: list[Path] = []
    infos: list[ShardInfo] = []
    unreadable: dict[str, Path] = {}
    for shard in find_input_shards(config.io.input, config.base_dir):
        paths.append(shard.path)
        try:
            infos.append(
                inspect_shard(
                    shard.path,
                    config.io.columns,
                    name=shard.name,
                    partitions=shard.partitions,
                    sampling_fields=sampling_fields,
                )
            )
        except ShardReadError:
            if config.on_bad_shard != "skip":
                raise
            unreadable[shard.name] = shard.path
    return paths, infos, unreadable


def job_folder(config: JobConfig) -> JobFolder:
    """The job's output folder and side-file names: plain for a folder of shards, named after
    the output file for one named output (``run-batch -o results.jsonl``: side files
    ``results.jsonl.manifest.json``, ...), so that batches can share a folder."""
    out_dir = config.resolve_path(config.io.output)
    if config.io.output_name is not None:
        return JobFolder.for_output_file(out_dir / config.io.output_name)
    return JobFolder(out_dir)


def _check_output_location(
    config: JobConfig, folder: JobFolder, paths: list[Path], names: list[str]
) -> None:
    """No output takes a side file's name. Parquet output: the output folder must lie outside
    the input set. OpenAI batch output (``run-batch``, the response file next to the request
    file): neither the output files nor the side files may be input files."""
    folder.check_output_names(names, "output shard")
    if config.io.output_format != "openai_jsonl":
        check_output_outside_inputs(folder.path, config.io.input, config.base_dir, paths)
    else:
        side = [p.name for p in folder.side_files()]
        check_output_files_not_inputs(folder.path, [*names, *side], paths)


def source_and_sink(
    config: JobConfig,
    out_dir: Path,
    checkpoint: Checkpoint,
    fingerprint: Mapping[str, Any],
    identities: Mapping[str, InputIdentity],
    on_commit: Callable[[str, ShardRecord], None],
    on_pending: Callable[[str, InputIdentity], None],
) -> tuple[Source, Sink]:
    """The job's source and sink by format: Parquet files (`FileSource`, `FileSink`), or
    OpenAI batch request/response files (`batchgen.job.openai_batch`). Each committed shard's
    record goes to `on_commit`; a response file's input, before its rename, to `on_pending`."""
    source: Source
    sink: Sink
    if config.io.input_format == "openai_jsonl":
        source = OpenAIBatchSource(config.io.batch_rows, config.io.max_line_bytes)
    else:
        source = FileSource(config)
    if config.io.output_format == "openai_jsonl":
        sink = OpenAIBatchSink(
            out_dir, checkpoint.tokenizer, checkpoint.source.name, identities, on_commit, on_pending
        )
    else:
        sink = FileSink(out_dir, config, fingerprint, identities, on_commit)
    return source, sink


@dataclass(slots=True)
class JobPlan:
    """A planned job under its output lock: the manifest (already reconciled with the files on
    disk), the loaded checkpoint, the shards still to generate in input order with their
    inputs' identities, how many are done already and the bad shards known so far."""

    out_dir: Path
    folder: JobFolder
    manifest: Manifest
    checkpoint: Checkpoint
    fingerprint: dict[str, Any]
    todo: list[ShardMeta]
    identities: dict[str, InputIdentity]
    infos: dict[str, ShardInfo]
    skipped: int
    bad_shards: dict[str, str]

    def release_weights(self) -> None:
        """Drop the checkpoint's weights, once an engine is built from them or none will be:
        an engine holds its own copies (on the CPU, packed), and the plain float32 ones (0.4 GB
        of the built-in model) would stay resident beside them for the whole run (issue 25).
        The config, tokenizer, source and fingerprint, which the job reads later, stay."""
        self.checkpoint = dataclasses.replace(self.checkpoint, weights={})

    def record_bad_shards(self, bad: Mapping[str, str]) -> dict[str, str]:
        """Record shards found unreadable while running (name -> error) in the manifest; returns
        every bad shard of the job. Raises JobError when the manifest cannot be saved."""
        try:
            for name, error in bad.items():
                self.manifest.mark_bad(name, bad_shard(self.infos[name], error))
        except OSError as exc:
            raise JobError(f"output folder {self.out_dir}: {exc}") from exc
        return {**self.bad_shards, **bad}


@contextmanager
def planned_job(config: JobConfig, *, restart: bool = False) -> Iterator[JobPlan]:
    """Check every input and the output folder, lock the folder (held until the block ends),
    check the device, load the model, open the manifest (refusing a changed configuration or
    changed inputs unless `restart`), clean temporary files and plan the shards still to do.
    Raises InputError / ConfigChangedError before anything in the output folder changes."""
    paths, infos, unreadable = _plan_shards(config)  # every input checked before any work
    folder = job_folder(config)
    out_dir = folder.path
    names = sorted([info.name for info in infos] + list(unreadable))
    _check_output_location(config, folder, paths, names)
    check_output_dir(out_dir)
    with OutputLock(out_dir, folder.lock_name):
        check_device(config)
        checkpoint = load_model(config)
        check_job_structured_outputs(config.sampling, checkpoint, source=str(config.source))
        fingerprint = job_fingerprint(config, checkpoint)
        try:
            manifest = open_manifest(
                folder,
                fingerprint,
                names,
                restart=restart,
                job_time=datetime.now().replace(microsecond=0).isoformat(),
                inputs=paths,
            )
            # A named output may share its folder with other jobs: clean only its own files.
            own = None if not folder.prefix else [*names, *manifest.committed(), *(p.name for p in folder.side_files())]
            clean_temp_files(out_dir, own)
            resume = plan_resume(
                out_dir,
                manifest,
                fingerprint,
                infos,
                list(unreadable),
                jsonl_outputs=config.io.output_format == "openai_jsonl",
            )
            for name, path in unreadable.items():
                manifest.mark_bad(name, bad_shard(path, f"{path}: unreadable Parquet footer"))
        except OSError as exc:
            raise InputError(f"output folder {out_dir}: {exc}") from exc
        recorded = manifest.bad_shards()
        todo = [
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
            for i, info in enumerate(resume.todo)
        ]
        plan = JobPlan(
            out_dir=out_dir,
            folder=folder,
            manifest=manifest,
            checkpoint=checkpoint,
            fingerprint=fingerprint,
            todo=todo,
            identities={info.name: info.identity() for info in resume.todo},
            infos={info.name: info for info in resume.todo},
            skipped=len(resume.skipped),
            bad_shards={**resume.known_bad, **{n: recorded[n].error for n in unreadable}},
        )
        del checkpoint  # the plan's reference is the only one: `release_weights` frees them
        yield plan


def build_job_engine(config: JobConfig, checkpoint: Checkpoint, job_time: str) -> tuple[LLMEngine, RowPreparer]:
    """The engine and row preparer of a job; `job_time` (ISO, from the manifest) is the date
    chat templates see. Raises InputError naming the job file's `engine` section."""
    engine = build_engine(config, checkpoint)
    preparer = RowPreparer(
        checkpoint.tokenizer,
        config.sampling,
        max_model_len=engine.max_model_len,
        prompt_too_long=config.prompt_too_long,
        job_seed=config.seed,
        now=datetime.fromisoformat(job_time),
        chat=config.chat,
    )
    return engine, preparer


def pipeline_options(config: JobConfig, *, use_tqdm: bool) -> PipelineOptions:
    """The pipeline's options from the job file (an OpenAI batch response needs the token ids
    and log-probabilities of every output)."""
    is_openai = config.io.output_format == "openai_jsonl"
    return PipelineOptions(
        columns=config.io.columns,
        batch_rows=config.io.batch_rows,
        order=config.order,
        window_rows=config.window_rows,
        max_error_rate=config.max_error_rate,
        min_rows_for_error_rate=config.min_rows_for_error_rate,
        include_token_ids=config.io.include_token_ids or is_openai,
        include_logprobs=config.io.include_logprobs or is_openai,
        use_tqdm=use_tqdm,
        on_bad_shard=config.on_bad_shard,
    )


def run_job(config: JobConfig, *, restart: bool = False, use_tqdm: bool = True) -> JobSummary:
    """Run (or resume) the job. Raises InputError / ConfigChangedError for setup problems
    (nothing in the output folder changed), JobError for a failure while running (nothing
    partial committed); other exceptions are bugs."""
    start = time.perf_counter()
    with planned_job(config, restart=restart) as plan:
        engine, preparer = build_job_engine(config, plan.checkpoint, plan.manifest.job_time)
        plan.release_weights()
        timeline = TimelineFile(
            plan.out_dir,
            new_run_id(),
            engine.timeline,
            keep_previous=not restart,
            name=plan.folder.timeline_name,
        )

        def committed(name: str, record: ShardRecord) -> None:
            plan.manifest.mark_committed(name, record)
            timeline.save()

        source, sink = source_and_sink(
            config,
            plan.out_dir,
            plan.checkpoint,
            plan.fingerprint,
            plan.identities,
            committed,
            plan.manifest.mark_pending,
        )
        options = dataclasses.replace(
            pipeline_options(config, use_tqdm=use_tqdm),
            on_progress=lambda _rows, _tokens, _hit_rate: timeline.save_if_due(),
        )
        try:
            stats = run_pipeline_sync(engine, preparer, source, sink, plan.todo, options)
        finally:
            timeline.save()  # a failed run's timeline is kept too
        bad = plan.record_bad_shards(stats.bad_shards)
        summary = make_summary(
            stats,
            time.perf_counter() - start,
            skipped=plan.skipped,
            bad_shards=bad,
            duplicate_ids=preparer.num_duplicate_ids_across_shards,
            ids_tracked=preparer.num_ids_tracked,
        )
        summary.data["run"] = {
            "run_id": timeline.run_id,
            "run_index": timeline.run_index,
            "model": config.model or "built-in SmolLM2-135M-Instruct",
            "config": _jsonable(dataclasses.asdict(config)),
            **describe_environment(
                str(engine.runner.model.device),
                str(engine.runner.model.dtype),
                engine.kv.num_blocks,
                linear_dtype=str(engine.runner.model.linear_dtype),
            ),
        }
        try:
            write_json_atomic(plan.folder.summary, summary.data)
        except OSError as exc:
            raise JobError(f"output folder {plan.out_dir}: {exc}") from exc
    return summary


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
