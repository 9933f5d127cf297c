"""Reading a job file: YAML parsing, `--set` overrides, key checks and validation into a
`JobConfig` (see batchgen/job/config.py for the layout of the file and every default).

Unknown keys at any level are errors, with the nearest known key as a suggestion; every error is
a `JobConfigError` whose message names the file, the dotted key and what was expected. Reads
nothing but the job file. Never imports torch.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import yaml

from batchgen._checks import check_int
from batchgen.engine.config import ENGINE_OPTION_OWNERS, EngineConfigs, engine_configs
from batchgen.engine.sampling_params import SamplingParams
from batchgen.io import ColumnMap
from batchgen.io.openai_batch import OPENAI_COLUMNS
from batchgen.job.config import IoConfig, JobConfig, JobConfigError, RayConfig
from batchgen.tokenizer.chat_options import CHAT_OPTION_KEYS, ChatOptions

__all__ = ["job_config_from_dict", "job_config_with_overrides", "load_job_config"]

_DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:[0-9]+)?)$")

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
    "on_bad_shard",
    "executor",
    "ray",
    "report",
    "timeline_rows",
    "task",
    "chat",
)
_INPUT_KEYS = ("path", "format", "columns", "batch_rows", "max_line_bytes")
_COLUMN_KEYS = ("id", "prompt", "messages", "prompt_token_ids", "sampling_params", "passthrough", "completion")
_OUTPUT_KEYS = ("path", "format", "include_token_ids", "include_logprobs")
_SAMPLING_KEYS = tuple(f.name for f in fields(SamplingParams))
_RAY_KEYS = tuple(f.name for f in fields(RayConfig))
_SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "input": _INPUT_KEYS,
    "input.columns": _COLUMN_KEYS,
    "output": _OUTPUT_KEYS,
    "sampling": _SAMPLING_KEYS,
    "engine": tuple(ENGINE_OPTION_OWNERS),
    "ray": _RAY_KEYS,
    "chat": CHAT_OPTION_KEYS,
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


_OWNER_MESSAGE = re.compile(r"^\w+\.(\w+)(?: must be |: expected )(.*)$", re.DOTALL)


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
    if data.get("format") == "openai_jsonl":
        if values:
            raise ValueError(
                "input.columns: not used with input.format openai_jsonl (the request file "
                "fixes the columns: custom_id, url, body)"
            )
        return OPENAI_COLUMNS
    messages = values.get("messages")
    token_ids = values.get("prompt_token_ids")
    completion = values.get("completion")
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
            # A scoring job names its prompt role (none: its completions are whole chats).
            prompt=values.get(
                "prompt",
                None if messages is not None or token_ids is not None or completion is not None else "prompt",
            ),
            completion=completion,
            messages=messages,
            prompt_token_ids=token_ids,
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
    optional: dict[str, Any] = {k: inputs[k] for k in ("batch_rows", "max_line_bytes") if k in inputs}
    optional |= {k: outputs[k] for k in ("include_token_ids", "include_logprobs") if k in outputs}
    if "format" in inputs:
        optional["input_format"] = inputs["format"]
    if "format" in outputs:
        optional["output_format"] = outputs["format"]
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
        structured = "SamplingParams.structured_outputs: "
        if str(exc).startswith(structured):
            raise ValueError("sampling.structured_outputs: " + str(exc)[len(structured) :]) from exc
        raise ValueError(_rekey(ValueError(str(exc)), "sampling")) from exc


def _engine(data: Mapping[str, Any]) -> EngineConfigs:
    values = _section(data, "", "engine", required=False)
    device = values.get("device")
    if device is not None and (not isinstance(device, str) or not _DEVICE_PATTERN.match(device)):
        raise ValueError(f"engine.device: expected cpu, cuda or cuda:N (or null), got {device!r}")
    if "hash_seed" in values:
        check_int("engine.hash_seed", values["hash_seed"], minimum=0)
    try:
        return engine_configs(values)
    except ValueError as exc:
        raise ValueError(_rekey(exc, "engine")) from exc


def _ray(data: Mapping[str, Any]) -> RayConfig:
    return RayConfig(**_section(data, "", "ray", required=False))


def _chat(data: Mapping[str, Any]) -> ChatOptions:
    values = _section(data, "", "chat", required=False)
    kwargs = values.get("template_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ValueError(f"chat.template_kwargs: expected a mapping of variable names to values, got {kwargs!r}")
    try:
        return ChatOptions.from_mapping(values)
    except ValueError as exc:
        raise ValueError(_rekey(exc, "chat")) from exc


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
        engine = _engine(data)
        optional = {
            f.name: data[f.name]
            for f in fields(JobConfig)
            if f.default is not MISSING and f.name in data and f.name not in ("ray", "chat")
        }
        return JobConfig(
            base_dir=base_dir,
            source=source,
            model=data.get("model"),
            io=io_config,
            sampling=sampling,
            scheduler=engine.scheduler,
            cache=engine.cache,
            runner=engine.runner,
            ray=_ray(data),
            chat=_chat(data),
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


def job_config_with_overrides(
    data: Mapping[str, Any], overrides: Sequence[str], *, source: Path, base_dir: Path
) -> JobConfig:
    """`job_config_from_dict` of `data` after the ``key.sub=value`` `overrides` (a job built
    by a command such as ``run-batch``). Raises JobConfigError naming `source` and the key."""
    try:
        values: dict[str, Any] = copy.deepcopy(dict(data))
        for override in overrides:
            _apply_override(values, override)
    except ValueError as exc:
        raise JobConfigError(f"{source}: {exc}") from exc
    return job_config_from_dict(values, source=source, base_dir=base_dir)


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
