"""The job file (``job.yaml``) as frozen dataclasses: its layout, validation of values and the
fingerprint of what changes output rows. Reading the file is `batchgen.job.config_file`.

Owns: `JobConfig` (one frozen dataclass per layer inside: `IoConfig`, `SamplingParams`,
`SchedulerConfig`, `CacheConfig`, `RunnerConfig`, `RayConfig`) and `JobConfigError`.

Layout (every key but ``input.path`` and ``output.path`` is optional; defaults shown)::

    model: null                 # path/to/hf_folder, path/to/model.gguf, or null: the built-in model
    task: generate              # generate | score (the log-likelihood of given completions:
                                #   columns.completion, no sampling section, output score_* columns)
    input:
      path: data/prompts        # a folder (its *.parquet files at any depth: Hive `key=value/`
                                #   partitions and nested folders) or a glob, relative to this file
      format: parquet           # parquet | openai_jsonl (an OpenAI Batch API request file; then
                                #   no `columns`: the file fixes them)
      columns:                  # input column names by role
        id: id                  # integer or string
        prompt: prompt          # plain text; or instead `messages: conversation` (a chat:
                                #   a list of {role, content}), or `prompt_token_ids: ids`
                                #   (a list<int32|int64> of token ids)
        sampling_params: null   # a struct column of per-row SamplingParams overrides
        completion: null        # task score: the text scored after the prompt, or a chat (a list
                                #   of {role, content}) whose last, assistant message is scored
                                #   after the chat template renders the others (then no prompt
                                #   role); a scoring job names its prompt role explicitly
        passthrough: []         # columns copied to the output unchanged (or Hive partition keys)
      batch_rows: 1024          # rows read per Arrow batch
      max_line_bytes: 16777216  # openai_jsonl: a longer request line is an error line
    output:
      path: out/                # folder of output shards and manifest.json
      format: parquet           # parquet | openai_jsonl (response lines; needs that input format)
      include_token_ids: false
      include_logprobs: false   # task score: the score_token_logprobs column
    sampling: {max_tokens: 16, temperature: 1.0}   # any SamplingParams field
    chat:                       # how chats (columns.messages) are rendered; vLLM's chat options
      template: null            # a Jinja chat template (the text, e.g. a YAML `|` block) used
                                #   instead of the tokenizer's
      template_kwargs: {}       # extra variables the template sees (vLLM's chat_template_kwargs),
                                #   e.g. {enable_thinking: false} for Qwen3
      add_generation_prompt: true   # end with the header of a new assistant turn
      continue_final_message: false # continue the final message instead (transformers' way: no
                                #   end-of-turn after its content); needs add_generation_prompt
                                #   false. Task score takes template and template_kwargs only
    engine:                     # SchedulerConfig, CacheConfig and RunnerConfig fields
      max_num_seqs: 256
      max_num_batched_tokens: 2048
      batching: continuous      # continuous | static
      enable_chunked_prefill: true  # false: a prompt's prefill in one step (before Sarathi-Serve)
      block_size: 16
      enable_prefix_caching: true
      num_kv_blocks: null       # or kv_cache_memory_bytes: null (null: sized from the device)
      max_model_len: null
      dtype: null               # float32 | float16 | bfloat16 (null: the device's default)
      device: null              # cpu | cuda | cuda:1 (null: cuda when available)
    seed: 0                     # job seed: each row's seed derives from it and the row id (and
                                #   each sample's from the row seed and the sample index), so rows
                                #   get different, reproducible noise. `sampling.seed`, if set,
                                #   replaces every row's seed: all rows then draw the SAME noise.
                                #   Ids repeated across shards get the same seed (counted in the
                                #   summary as `rows.duplicate_ids_across_shards`).
    prompt_too_long: error      # error | truncate_left | truncate_right
    order: prefix               # prefix (group shared prefixes) | input
    window_rows: 1024           # rows reordered together when order is prefix
    max_error_rate: 0.5         # stop when error rows / rows done exceeds it ...
    min_rows_for_error_rate: 100  # ... after at least this many rows
    on_bad_shard: fail          # fail | skip: an unreadable input shard (bad footer, corrupt row
                                #   group) stops the job, or is skipped and recorded with its
                                #   error in manifest.json and summary.json (`bad_shards`)
    executor: local             # local | ray (the same job over a Ray cluster; batchgen[ray])
    ray:                        # read only when executor is ray
      address: null             # null: start or join a local Ray; "auto": the running cluster;
                                #   or "host:port" of the cluster's GCS
      num_workers: 2            # Ray actors, each with its own engine (one per GPU on a cluster)
      num_cpus_per_worker: 1
      num_gpus_per_worker: 0    # 1 on GPU clusters
      max_retries: 2            # more attempts of a shard whose worker died
    report: true                # write report.html (plots of timeline.parquet) at the end of a run
    timeline_rows: 1024         # the most rows of the engine timeline per run (even, >= 2)

Invariants:
- Unknown keys at any level are errors (with the nearest known key as a suggestion); every
  error is a `JobConfigError` whose message names the file, the dotted key and what was
  expected, ready to print without a traceback.
- Validation does no I/O beyond reading the job file: whether inputs exist is the pipeline's
  question. Relative paths resolve against the job file's folder (`JobConfig.resolve_path`).
- `fingerprint_fields` holds exactly what changes the output rows; throughput knobs (order,
  windows, engine sizes) stay out so a resumed job may change them.

May import: the standard library, yaml, batchgen.io, batchgen.engine.config,
batchgen.engine.sampling_params, batchgen.tokenizer.chat_options. Never torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from batchgen._checks import check_int
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.structured.params import StructuredOutputsParams
from batchgen.io import ColumnMap, resolve_path
from batchgen.io.openai_batch import DEFAULT_MAX_LINE_BYTES
from batchgen.tokenizer.chat_options import ChatOptions

__all__ = [
    "Executor",
    "Format",
    "IoConfig",
    "JobConfig",
    "JobConfigError",
    "OnBadShard",
    "Order",
    "PromptTooLong",
    "RayConfig",
    "Task",
]

PromptTooLong = Literal["error", "truncate_left", "truncate_right"]
Order = Literal["prefix", "input"]
OnBadShard = Literal["fail", "skip"]
Executor = Literal["local", "ray"]
Task = Literal["generate", "score"]
Format = Literal["parquet", "openai_jsonl"]

_MAX_SEED = 2**63 - 1


class JobConfigError(Exception):
    """A bad job file or override; the message names the file and the key, for users."""


def _expect_bool(key: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")


def _expect_text(key: str, value: object, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key}: expected {what}, got {value!r}")


def _expect_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True, slots=True)
class IoConfig:
    """Where rows come from and go to; error messages use the job file's keys."""

    input: str
    columns: ColumnMap
    output: str
    batch_rows: int = 1024
    include_token_ids: bool = False
    include_logprobs: bool = False
    input_format: Format = "parquet"
    output_format: Format = "parquet"
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    # The output file name of a single input shard (`batchgen run-batch -o`); None: the
    # input's name. Not a job-file key.
    output_name: str | None = None

    def __post_init__(self) -> None:
        _expect_text("input.path", self.input, "a folder or glob of Parquet files")
        _expect_choice("input.format", self.input_format, get_args(Format))
        _expect_choice("output.format", self.output_format, get_args(Format))
        if self.output_format == "openai_jsonl" and self.input_format != "openai_jsonl":
            raise ValueError(
                "output.format: openai_jsonl needs input.format: openai_jsonl (a response "
                "line answers a request line)"
            )
        if self.output_name is not None:
            _expect_text("output name", self.output_name, "a file name")
        if not isinstance(self.columns, ColumnMap):
            raise ValueError(f"input.columns: expected a ColumnMap, got {self.columns!r}")
        _expect_text("output.path", self.output, "a folder")
        check_int("input.batch_rows", self.batch_rows, minimum=1)
        check_int("input.max_line_bytes", self.max_line_bytes, minimum=1)
        _expect_bool("output.include_token_ids", self.include_token_ids)
        _expect_bool("output.include_logprobs", self.include_logprobs)


def _expect_number(key: str, value: object, minimum: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= minimum:
        raise ValueError(f"{key}: expected a number >= {minimum:g}, got {value!r}")


@dataclass(frozen=True, slots=True)
class RayConfig:
    """The `ray:` section: where the cluster is and what each worker (a Ray actor) holds.

    `num_cpus_per_worker` / `num_gpus_per_worker` are Ray resource amounts (fractions allowed);
    `max_retries` is how many more attempts a shard gets after its worker died or failed (and
    how many more starts a worker slot gets after its worker failed to start).
    `worker_start_timeout_s`: seconds a worker may take to be placed, load the model and build
    its engine; `worker_stall_timeout_s`: seconds a worker holding a shard may go without a
    result or any progress (rows or output tokens) before the driver declares it dead.
    """

    address: str | None = None
    num_workers: int = 2
    num_cpus_per_worker: float = 1
    num_gpus_per_worker: float = 0
    max_retries: int = 2
    worker_start_timeout_s: float = 300
    worker_stall_timeout_s: float = 1800

    def __post_init__(self) -> None:
        if self.address is not None:
            _expect_text("ray.address", self.address, '"auto", "host:port" or null')
        check_int("ray.num_workers", self.num_workers, minimum=1)
        _expect_number("ray.num_cpus_per_worker", self.num_cpus_per_worker, 0)
        _expect_number("ray.num_gpus_per_worker", self.num_gpus_per_worker, 0)
        check_int("ray.max_retries", self.max_retries, minimum=0)
        _expect_number("ray.worker_start_timeout_s", self.worker_start_timeout_s, 1)
        _expect_number("ray.worker_stall_timeout_s", self.worker_stall_timeout_s, 1)


@dataclass(frozen=True, slots=True)
class JobConfig:
    """A whole job, validated; error messages use the job file's keys."""

    base_dir: Path
    source: Path
    model: str | None
    io: IoConfig
    sampling: SamplingParams
    scheduler: SchedulerConfig
    cache: CacheConfig
    runner: RunnerConfig
    seed: int = 0
    prompt_too_long: PromptTooLong = "error"
    order: Order = "prefix"
    window_rows: int = 1024
    max_error_rate: float = 0.5
    min_rows_for_error_rate: int = 100
    on_bad_shard: OnBadShard = "fail"
    executor: Executor = "local"
    ray: RayConfig = RayConfig()
    report: bool = True
    timeline_rows: int = 1024
    task: Task = "generate"
    chat: ChatOptions = dataclasses.field(default_factory=ChatOptions)

    def __post_init__(self) -> None:
        if self.model is not None:
            _expect_text("model", self.model, "a Hugging Face folder or a .gguf file, or null")
        if (
            not isinstance(self.seed, int)
            or isinstance(self.seed, bool)
            or not 0 <= self.seed <= _MAX_SEED
        ):
            raise ValueError(f"seed: expected an integer in [0, 2**63 - 1], got {self.seed!r}")
        _expect_choice("prompt_too_long", self.prompt_too_long, get_args(PromptTooLong))
        _expect_choice("order", self.order, get_args(Order))
        check_int("window_rows", self.window_rows, minimum=1)
        rate = self.max_error_rate
        if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 <= rate <= 1:
            raise ValueError(f"max_error_rate: expected a number in [0, 1], got {rate!r}")
        check_int("min_rows_for_error_rate", self.min_rows_for_error_rate, minimum=0)
        _expect_choice("on_bad_shard", self.on_bad_shard, get_args(OnBadShard))
        _expect_choice("executor", self.executor, get_args(Executor))
        if not isinstance(self.ray, RayConfig):
            raise ValueError(f"ray: expected a RayConfig, got {self.ray!r}")
        _expect_bool("report", self.report)
        check_int("timeline_rows", self.timeline_rows, minimum=2)
        if self.timeline_rows % 2:
            raise ValueError(f"timeline_rows: expected an even number, got {self.timeline_rows}")
        if not isinstance(self.chat, ChatOptions):
            raise ValueError(f"chat: expected ChatOptions, got {self.chat!r}")
        self._check_task()

    def _check_task(self) -> None:
        _expect_choice("task", self.task, get_args(Task))
        columns = self.io.columns
        if self.task == "generate":
            if columns.completion is not None:
                raise ValueError("input.columns.completion: only a scoring job (task: score) reads completions")
            return
        if columns.completion is None:
            raise ValueError("task: score needs input.columns.completion (the text or chat to score)")
        if columns.sampling_params is not None:
            raise ValueError("input.columns.sampling_params: task score draws no tokens; drop the column")
        # A scored chat's prompt is rendered with the generation prompt, then the reply follows.
        for key, value, default in (
            ("continue_final_message", self.chat.continue_final_message, False),
            ("add_generation_prompt", self.chat.add_generation_prompt, True),
        ):
            if value != default:
                raise ValueError(
                    f"chat.{key}: task score renders the prompt with the generation prompt before "
                    "the scored reply; remove the key (chat.template and chat.template_kwargs apply)"
                )
        if self.sampling != SamplingParams():
            raise ValueError("sampling: task score draws no tokens; remove the sampling section")
        if "openai_jsonl" in (self.io.input_format, self.io.output_format):
            raise ValueError(
                "task: score reads and writes Parquet (an OpenAI batch file scores with /v1/completions, "
                "echo: true, max_tokens: 0)"
            )

    def resolve_path(self, p: str) -> Path:
        """`p` as written in the job file, made absolute against the job file's folder."""
        resolved: Path = resolve_path(p, self.base_dir)
        return resolved

    def fingerprint_fields(self) -> dict[str, Any]:
        """The JSON-able settings that change output rows (stored in the manifest; a resumed
        job must match them): columns, all sampling fields, seed, prompt_too_long, runner dtype
        and max_model_len, the optional output columns, the input/output formats when not
        Parquet, and the chat options when not the defaults. The model is fingerprinted by its contents (`Checkpoint.fingerprint`), not by
        the path written here, so a copied model folder resumes."""
        columns = self.io.columns
        result: dict[str, Any] = {
            "columns": {
                "id": columns.id,
                "prompt": columns.prompt,
                "messages": columns.messages,
                "sampling_params": columns.sampling_params,
                "passthrough": list(columns.passthrough),
            },
            "sampling": _sampling_fingerprint(self.sampling),
            "seed": self.seed,
            "prompt_too_long": self.prompt_too_long,
            "runner": {"dtype": self.runner.dtype, "max_model_len": self.runner.max_model_len},
            "output": {
                "include_token_ids": self.io.include_token_ids,
                "include_logprobs": self.io.include_logprobs,
            },
        }
        # Added only when used, so the fingerprints of existing Parquet jobs stay as they were.
        if columns.prompt_token_ids is not None:
            result["columns"]["prompt_token_ids"] = columns.prompt_token_ids
        if self.runner.linear_dtype not in (None, "float32"):
            result["runner"]["linear_dtype"] = self.runner.linear_dtype
        if self.task != "generate":
            result["task"] = self.task
            result["columns"]["completion"] = columns.completion
        if (self.io.input_format, self.io.output_format) != ("parquet", "parquet"):
            result["format"] = {"input": self.io.input_format, "output": self.io.output_format}
        if self.io.input_format == "openai_jsonl" and self.io.max_line_bytes != DEFAULT_MAX_LINE_BYTES:
            result["format"]["max_line_bytes"] = self.io.max_line_bytes
        if not self.chat.is_default:
            result["chat"] = self.chat.fingerprint()
        return result


_LATER_FIELDS = frozenset(
    {
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "structured_outputs",  # issue 22
        "prompt_logprobs",
        "skip_special_tokens",
        "include_stop_str_in_output",
    }
)


def _plain(name: str, value: Any) -> Any:
    """A later field's value as JSON gives it back (sorted [id, bias] pairs, lists, floats)."""
    if name == "logit_bias":
        return [[int(k), float(v)] for k, v in sorted(value.items())]
    if name in ("allowed_token_ids", "bad_words"):
        return list(value)
    if name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        return float(value)
    if name == "structured_outputs":
        structured = StructuredOutputsParams.coerce(value)
        return None if structured is None else structured.to_dict()  # {kind: value}
    return value


def _sampling_fingerprint(params: SamplingParams) -> dict[str, Any]:
    # Normalized so that `temperature: 0` and `temperature: 0.0` fingerprint alike. Fields added
    # later (issue 21) appear only when set, so the fingerprints of existing jobs stay as they were.
    result: dict[str, Any] = {}
    default = SamplingParams()
    for field in fields(SamplingParams):
        value = getattr(params, field.name)
        if field.name in _LATER_FIELDS:
            if value == getattr(default, field.name):
                continue
            value = _plain(field.name, value)
        if field.name == "stop":
            value = list(params.stop_strings)
        elif field.name == "stop_token_ids":
            value = list(value)
        elif field.name in ("temperature", "top_p", "min_p"):
            value = float(value)
        result[field.name] = value
    return result
