"""The job file (``job.yaml``): loading, validating and fingerprinting a job's configuration.

Owns: `JobConfig` (one frozen dataclass per layer inside: `IoConfig`, `SamplingParams`,
`SchedulerConfig`, `CacheConfig`, `RunnerConfig`), `load_job_config` and `JobConfigError`.

Layout (every key but ``input.path`` and ``output.path`` is optional; defaults shown)::

    model: null                 # path/to/hf_folder, path/to/model.gguf, or null: the built-in model
    input:
      path: data/prompts        # a folder (its *.parquet files) or a glob, relative to this file
      columns:                  # input column names by role
        id: id                  # integer or string
        prompt: prompt          # plain text; or instead `messages: conversation` (a chat:
                                #   a list of {role, content})
        sampling_params: null   # a struct column of per-row SamplingParams overrides
        passthrough: []         # columns copied to the output unchanged
      batch_rows: 1024          # rows read per Arrow batch
    output:
      path: out/                # folder of output shards and manifest.json
      include_token_ids: false
      include_logprobs: false
    sampling: {max_tokens: 16, temperature: 1.0}   # any SamplingParams field
    engine:                     # SchedulerConfig, CacheConfig and RunnerConfig fields
      max_num_seqs: 256
      max_num_batched_tokens: 2048
      batching: continuous      # continuous | static
      block_size: 16
      enable_prefix_caching: true
      num_kv_blocks: null       # or kv_cache_memory_bytes: null (null: sized from the device)
      max_model_len: null
      dtype: null               # float32 | float16 | bfloat16 (null: the device's default)
      device: null              # cpu | cuda | cuda:1 (null: cuda when available)
    seed: 0                     # job seed; each row's seed derives from it, the id and the sample
    prompt_too_long: error      # error | truncate_left | truncate_right
    order: prefix               # prefix (group shared prefixes) | input
    window_rows: 1024           # rows reordered together when order is prefix
    max_error_rate: 0.5         # stop when error rows / rows done exceeds it ...
    min_rows_for_error_rate: 100  # ... after at least this many rows
    executor: local             # local (ray is not available yet)

Invariants:
- Unknown keys at any level are errors (with the nearest known key as a suggestion); every
  error is a `JobConfigError` whose message names the file, the dotted key and what was
  expected, ready to print without a traceback.
- Validation does no I/O beyond reading the job file: whether inputs exist is the pipeline's
  question. Relative paths resolve against the job file's folder (`JobConfig.resolve_path`).
- `fingerprint_fields` holds exactly what changes the output rows; throughput knobs (order,
  windows, engine sizes) stay out so a resumed job may change them.

May import: the standard library, yaml, batchgen.io, batchgen.config,
batchgen.sampling_params. Never torch.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from batchgen.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.io import ColumnMap
from batchgen.sampling_params import SamplingParams

__all__ = [
    "Executor",
    "IoConfig",
    "JobConfig",
    "JobConfigError",
    "Order",
    "PromptTooLong",
    "job_config_from_dict",
    "load_job_config",
]

PromptTooLong = Literal["error", "truncate_left", "truncate_right"]
Order = Literal["prefix", "input"]
Executor = Literal["local", "ray"]

_MAX_SEED = 2**63 - 1
_DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:[0-9]+)?)$")


class JobConfigError(Exception):
    """A bad job file or override; the message names the file and the key, for users."""


def _expect_int(key: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{key}: expected an integer >= {minimum}, got {value!r}")


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

    def __post_init__(self) -> None:
        _expect_text("input.path", self.input, "a folder or glob of Parquet files")
        if not isinstance(self.columns, ColumnMap):
            raise ValueError(f"input.columns: expected a ColumnMap, got {self.columns!r}")
        _expect_text("output.path", self.output, "a folder")
        _expect_int("input.batch_rows", self.batch_rows, 1)
        _expect_bool("output.include_token_ids", self.include_token_ids)
        _expect_bool("output.include_logprobs", self.include_logprobs)


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
    executor: Executor = "local"

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
        _expect_int("window_rows", self.window_rows, 1)
        rate = self.max_error_rate
        if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 <= rate <= 1:
            raise ValueError(f"max_error_rate: expected a number in [0, 1], got {rate!r}")
        _expect_int("min_rows_for_error_rate", self.min_rows_for_error_rate, 0)
        _expect_choice("executor", self.executor, get_args(Executor))
        if self.executor == "ray":
            raise ValueError("executor 'ray' is not available yet; use executor: local")

    def resolve_path(self, p: str) -> Path:
        """`p` as written in the job file, made absolute against the job file's folder."""
        path = Path(p).expanduser()
        return Path(os.path.normpath(path if path.is_absolute() else self.base_dir / path))

    def fingerprint_fields(self) -> dict[str, Any]:
        """The JSON-able settings that change output rows (stored in the manifest; a resumed
        job must match them): model as written, columns, all sampling fields, seed,
        prompt_too_long, runner dtype and max_model_len, the optional output columns."""
        columns = self.io.columns
        return {
            "model": self.model,
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


def _sampling_fingerprint(params: SamplingParams) -> dict[str, Any]:
    # Normalized so that `temperature: 0` and `temperature: 0.0` fingerprint alike.
    result: dict[str, Any] = {}
    for field in fields(SamplingParams):
        value = getattr(params, field.name)
        if field.name == "stop":
            value = list(params.stop_strings)
        elif field.name == "stop_token_ids":
            value = list(value)
        elif field.name in ("temperature", "top_p", "min_p"):
            value = float(value)
        result[field.name] = value
    return result


# --- keys of the job file -------------------------------------------------------------------

_TOP_KEYS = (
    "model",
    "input",
    "output",
    "sampling",
    "engine",
    "seed",
    "prompt_too_long",
    "order",
    "window_rows",
    "max_error_rate",
    "min_rows_for_error_rate",
    "executor",
)
_INPUT_KEYS = ("path", "columns", "batch_rows")
_COLUMN_KEYS = ("id", "prompt", "messages", "sampling_params", "passthrough")
_OUTPUT_KEYS = ("path", "include_token_ids", "include_logprobs")
_SAMPLING_KEYS = tuple(f.name for f in fields(SamplingParams))
_ENGINE_OWNERS: dict[str, type[SchedulerConfig | CacheConfig | RunnerConfig]] = {
    f.name: owner for owner in (SchedulerConfig, CacheConfig, RunnerConfig) for f in fields(owner)
}
_SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "input": _INPUT_KEYS,
    "input.columns": _COLUMN_KEYS,
    "output": _OUTPUT_KEYS,
    "sampling": _SAMPLING_KEYS,
    "engine": tuple(_ENGINE_OWNERS),
}


def _dotted(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


def _check_keys(mapping: Mapping[Any, Any], where: str, allowed: Sequence[str]) -> None:
    for key in mapping:
        if key in allowed:
            continue
        homes = [s for s, keys in _SECTION_KEYS.items() if key in keys and s != where]
        close = difflib.get_close_matches(str(key), allowed, n=1)
        if homes:
            hint = f" ('{key}' belongs under '{homes[0]}')"
        elif close:
            hint = f" (did you mean '{_dotted(where, close[0])}'?)"
        else:
            hint = f"; expected one of: {', '.join(allowed)}"
        raise ValueError(f"unknown key '{_dotted(where, key)}'{hint}")


def _section(data: Mapping[str, Any], where: str, key: str, *, required: bool) -> dict[str, Any]:
    dotted = _dotted(where, key)
    value = data.get(key)
    if value is None:
        if required:
            raise ValueError(f"missing required key '{dotted}'")
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{dotted}: expected a mapping, got {value!r}")
    allowed = _SECTION_KEYS[dotted]
    _check_keys(value, dotted, allowed)
    return dict(value)


_OWNER_MESSAGE = re.compile(r"^\w+\.(\w+) must be (.*)$", re.DOTALL)


def _rekey(exc: ValueError, section: str) -> str:
    """'SamplingParams.top_p must be in (0, 1], got 2' -> 'sampling.top_p: expected a value in
    (0, 1], got 2'."""
    match = _OWNER_MESSAGE.match(str(exc))
    if match is None:
        return f"{section}: {exc}"
    expected = match.group(2)
    if expected.startswith("in "):
        expected = f"a value {expected}"
    return f"{section}.{match.group(1)}: expected {expected}"


def _columns(data: Mapping[str, Any]) -> ColumnMap:
    values = _section(data, "input", "columns", required=False)
    messages = values.get("messages")
    passthrough = values.get("passthrough", [])
    if passthrough is None:
        passthrough = []
    if not isinstance(passthrough, list) or not all(isinstance(p, str) for p in passthrough):
        raise ValueError(
            f"input.columns.passthrough: expected a list of column names, got {passthrough!r}"
        )
    try:
        return ColumnMap(
            id=values.get("id", "id"),
            prompt=values.get("prompt", None if messages is not None else "prompt"),
            messages=messages,
            sampling_params=values.get("sampling_params"),
            passthrough=tuple(passthrough),
        )
    except ValueError as exc:
        raise ValueError(f"input.{exc}") from exc


def _io(data: Mapping[str, Any]) -> IoConfig:
    inputs = _section(data, "", "input", required=True)
    outputs = _section(data, "", "output", required=True)
    for section, values in (("input", inputs), ("output", outputs)):
        if "path" not in values:
            raise ValueError(f"missing required key '{section}.path'")
    optional = {k: inputs[k] for k in ("batch_rows",) if k in inputs}
    optional |= {k: outputs[k] for k in ("include_token_ids", "include_logprobs") if k in outputs}
    return IoConfig(
        input=inputs["path"], columns=_columns(inputs), output=outputs["path"], **optional
    )


def _sampling(data: Mapping[str, Any]) -> SamplingParams:
    values = _section(data, "", "sampling", required=False)
    for key in ("stop", "stop_token_ids"):
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])
    try:
        return SamplingParams.from_mapping(values)
    except (ValueError, TypeError) as exc:
        raise ValueError(_rekey(ValueError(str(exc)), "sampling")) from exc


def _engine(data: Mapping[str, Any]) -> tuple[SchedulerConfig, CacheConfig, RunnerConfig]:
    values = _section(data, "", "engine", required=False)
    if values.get("device") is not None:
        _expect_text("engine.device", values["device"], "a device such as cpu or cuda:0, or null")
        if not _DEVICE_PATTERN.match(values["device"]):
            raise ValueError(
                f"engine.device: expected cpu, cuda or cuda:N (or null), got {values['device']!r}"
            )
    if "hash_seed" in values:
        _expect_int("engine.hash_seed", values["hash_seed"], 0)
    try:
        return (
            SchedulerConfig(
                **{k: v for k, v in values.items() if _ENGINE_OWNERS[k] is SchedulerConfig}
            ),
            CacheConfig(**{k: v for k, v in values.items() if _ENGINE_OWNERS[k] is CacheConfig}),
            RunnerConfig(**{k: v for k, v in values.items() if _ENGINE_OWNERS[k] is RunnerConfig}),
        )
    except ValueError as exc:
        raise ValueError(_rekey(exc, "engine")) from exc


def job_config_from_dict(data: Mapping[str, Any], *, source: Path, base_dir: Path) -> JobConfig:
    """Validate a parsed job file. Raises JobConfigError naming `source` and the key."""
    try:
        if not isinstance(data, Mapping):
            raise ValueError(
                f"expected a mapping of keys ({', '.join(_TOP_KEYS[:3])}, ...), got {data!r}"
            )
        _check_keys(data, "", _TOP_KEYS)
        io_config = _io(data)
        sampling = _sampling(data)
        scheduler, cache, runner = _engine(data)
        optional = {
            f.name: data[f.name]
            for f in fields(JobConfig)
            if f.default is not MISSING and f.name in data
        }
        return JobConfig(
            base_dir=base_dir,
            source=source,
            model=data.get("model"),
            io=io_config,
            sampling=sampling,
            scheduler=scheduler,
            cache=cache,
            runner=runner,
            **optional,
        )
    except ValueError as exc:
        raise JobConfigError(f"{source}: {exc}") from exc


# --- YAML -----------------------------------------------------------------------------------

# PyYAML follows YAML 1.1, which reads `1e-3` as a string; YAML 1.2 (and users) read a number.
_FLOAT_PATTERN = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


def _construct_mapping(loader: Any, node: Any) -> dict[Any, Any]:
    """A plain dict, refusing a key written twice (PyYAML would keep the last silently)."""
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}'", key_node.start_mark
            )
        seen.add(key)
    result: dict[Any, Any] = loader.construct_mapping(node, deep=True)
    return result


# Built with type() because yaml ships without type hints (mypy --strict refuses subclassing Any).
_JobLoader: Any = type("_JobLoader", (yaml.SafeLoader,), {})
_JobLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_PATTERN, list("-+0123456789."))
_JobLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str) -> Any:
    """Parse YAML; raises ValueError with the line and column of the problem."""
    try:
        return yaml.load(text, Loader=_JobLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"invalid YAML{where}: {exc.problem or exc.context or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid YAML: {exc}") from None


def _apply_override(data: dict[str, Any], override: str) -> None:
    key, sep, raw = override.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ValueError(
            f"malformed override '{override}': expected key.sub=value, e.g. sampling.max_tokens=64"
        )
    try:
        value = _parse_yaml(raw)
    except ValueError as exc:
        raise ValueError(f"malformed override '{override}': the value is {exc}") from None
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ValueError(
                f"override '{override}': '{'.'.join(parts[: depth + 1])}' is not a mapping"
            )
        node = child
    node[parts[-1]] = value


def load_job_config(path: Path, overrides: Sequence[str] = ()) -> JobConfig:
    """Read, override and validate a job file.

    `overrides` are ``key.sub=value`` strings (value parsed as YAML), applied in order before
    validation. Raises JobConfigError naming the file and the key; reads nothing but the file.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobConfigError(f"{path}: cannot read the job file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise JobConfigError(f"{path}: the job file is not UTF-8 text ({exc.reason})") from None
    try:
        data = _parse_yaml(text)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValueError(
                f"expected a mapping of keys ({', '.join(_TOP_KEYS[:3])}, ...), "
                f"got {type(data).__name__} {data!r}"
            )
        data = copy.deepcopy(data)
        for override in overrides:
            _apply_override(data, override)
    except ValueError as exc:
        raise JobConfigError(f"{path}: {exc}") from exc
    return job_config_from_dict(data, source=path, base_dir=path.resolve().parent)
