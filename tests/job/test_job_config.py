"""job.yaml: a full valid file, and bad files failing with the file name and the key."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from pathlib import Path

import pytest

from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.sampling_params import SamplingParams
from batchgen.io import ColumnMap
from batchgen.job.config import IoConfig, JobConfig, JobConfigError, RayConfig
from batchgen.job.config_file import job_config_from_dict, load_job_config

FULL_JOB = """\
# A nightly labelling job: every key, with its value spelled out.
model: models/smol.gguf         # a Hugging Face folder or a .gguf file; null = built-in model
input:
  path: data/*.parquet          # a folder of shards or a glob, relative to this file
  columns:
    id: row_id                  # integer or string ids
    messages: conversation      # a chat column: list of {role, content}
    sampling_params: sp         # per-row overrides (a struct column)
    passthrough: [lang, source] # copied to the output unchanged
  batch_rows: 512
output:
  path: out/labels              # output shards + manifest.json
  include_token_ids: true
  include_logprobs: false
sampling:
  n: 2
  max_tokens: 128
  temperature: 7e-1             # YAML 1.1 would read this as a string; we read a number
  top_p: 0.95
  stop: ["\\n\\n"]
  seed: 11
engine:
  max_num_seqs: 64
  max_num_batched_tokens: 4096
  batching: continuous
  block_size: 32
  enable_prefix_caching: false
  num_kv_blocks: 1000
  kv_cache_memory_bytes: null
  max_model_len: 4096
  dtype: bfloat16
  device: cuda:0
seed: 42
prompt_too_long: truncate_left
order: input
window_rows: 2048
max_error_rate: 0.25
min_rows_for_error_rate: 50
executor: local
"""

MINIMAL_JOB = """\
# The smallest job: built-in model, default columns (id, prompt), default sampling.
input: {path: data}
output: {path: out}
"""


def _job_file(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_full_job(tmp_path: Path) -> None:
    path = _job_file(tmp_path, FULL_JOB)
    config = load_job_config(path)
    assert config == JobConfig(
        base_dir=tmp_path.resolve(),
        source=path,
        model="models/smol.gguf",
        io=IoConfig(
            input="data/*.parquet",
            columns=ColumnMap(
                id="row_id",
                prompt=None,
                messages="conversation",
                sampling_params="sp",
                passthrough=("lang", "source"),
            ),
            output="out/labels",
            batch_rows=512,
            include_token_ids=True,
            include_logprobs=False,
        ),
        sampling=SamplingParams(
            n=2, max_tokens=128, temperature=0.7, top_p=0.95, stop=("\n\n",), seed=11
        ),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096),
        cache=CacheConfig(block_size=32, enable_prefix_caching=False, num_kv_blocks=1000),
        runner=RunnerConfig(device="cuda:0", dtype="bfloat16", max_model_len=4096),
        seed=42,
        prompt_too_long="truncate_left",
        order="input",
        window_rows=2048,
        max_error_rate=0.25,
        min_rows_for_error_rate=50,
        executor="local",
    )
    assert config.resolve_path("out/labels") == tmp_path.resolve() / "out" / "labels"
    assert config.resolve_path("/abs/x") == Path("/abs/x")


def test_minimal_job_defaults(tmp_path: Path) -> None:
    config = load_job_config(_job_file(tmp_path, MINIMAL_JOB))
    assert config.model is None
    assert config.io == IoConfig(input="data", columns=ColumnMap(), output="out")
    assert config.sampling == SamplingParams()
    assert (config.scheduler, config.cache, config.runner) == (
        SchedulerConfig(),
        CacheConfig(),
        RunnerConfig(),
    )
    assert (config.seed, config.order, config.executor) == (0, "prefix", "local")


def test_fingerprint_fields(tmp_path: Path) -> None:
    config = load_job_config(_job_file(tmp_path, FULL_JOB))
    assert config.fingerprint_fields() == {
        "columns": {
            "id": "row_id",
            "prompt": None,
            "messages": "conversation",
            "sampling_params": "sp",
            "passthrough": ["lang", "source"],
        },
        "sampling": {
            "n": 2,
            "max_tokens": 128,
            "temperature": 0.7,
            "top_p": 0.95,
            "top_k": -1,
            "min_p": 0.0,
            "seed": 11,
            "stop": ["\n\n"],
            "stop_token_ids": [],
            "ignore_eos": False,
            "logprobs": None,
        },
        "seed": 42,
        "prompt_too_long": "truncate_left",
        "runner": {"dtype": "bfloat16", "max_model_len": 4096},
        "output": {"include_token_ids": True, "include_logprobs": False},
    }
    # throughput knobs do not change the fingerprint
    faster = load_job_config(
        _job_file(tmp_path, FULL_JOB),
        ["order=prefix", "window_rows=64", "engine.max_num_seqs=8", "input.batch_rows=16"],
    )
    assert faster.fingerprint_fields() == config.fingerprint_fields()
    # the model counts by its contents (run_job adds them), not by where it lies
    moved = load_job_config(_job_file(tmp_path, FULL_JOB), ["model=copies/smol.gguf"])
    assert moved.fingerprint_fields() == config.fingerprint_fields()
    # and `temperature: 0` fingerprints like `temperature: 0.0`
    zero = load_job_config(_job_file(tmp_path, MINIMAL_JOB), ["sampling.temperature=0"])
    zero_float = load_job_config(_job_file(tmp_path, MINIMAL_JOB), ["sampling.temperature=0.0"])
    assert zero.fingerprint_fields() == zero_float.fingerprint_fields()


def test_overrides_are_applied_before_validation(tmp_path: Path) -> None:
    path = _job_file(tmp_path, MINIMAL_JOB)
    config = load_job_config(
        path,
        [
            "sampling.max_tokens=64",
            "engine.max_num_seqs=3",
            "input.columns.passthrough=[lang]",
            "model=other.gguf",
            "output.path=elsewhere",
        ],
    )
    assert config.sampling.max_tokens == 64
    assert config.scheduler.max_num_seqs == 3
    assert config.io.columns.passthrough == ("lang",)
    assert config.model == "other.gguf"
    assert config.io.output == "elsewhere"


BAD_CASES = [
    # (id, job text, overrides, substrings the message must contain besides the file name)
    (
        "bad-yaml",
        "input: {path: d}\noutput: path: out\n",
        [],
        ["invalid YAML at line 2, column 13: mapping values are not allowed here"],
    ),
    ("not-a-mapping", "- input\n- output\n", [], ["expected a mapping"]),
    ("duplicate-key", MINIMAL_JOB + "input: {path: x}\n", [], ["line 4", "duplicate key 'input'"]),
    (
        "unknown-top-level",
        MINIMAL_JOB + "samplng: {max_tokens: 4}\n",
        [],
        ["unknown key 'samplng' (did you mean 'sampling'?)"],
    ),
    (
        "unknown-nested",
        MINIMAL_JOB + "engine: {max_num_seq: 4}\n",
        [],
        ["unknown key 'engine.max_num_seq' (did you mean 'engine.max_num_seqs'?)"],
    ),
    (
        "key-in-wrong-section",
        MINIMAL_JOB + "engine: {max_tokens: 4}\n",
        [],
        ["unknown key 'engine.max_tokens' ('max_tokens' belongs under 'sampling')"],
    ),
    (
        "unknown-column-role",
        "input: {path: d, columns: {text: t}}\noutput: {path: o}\n",
        [],
        ["unknown key 'input.columns.text'", "expected one of: id, prompt"],
    ),
    (
        "wrong-int",
        MINIMAL_JOB + "engine: {max_num_seqs: many}\n",
        [],
        ["engine.max_num_seqs: expected an integer >= 1, got 'many'"],
    ),
    (
        "wrong-bool",
        "input: {path: d}\noutput: {path: o, include_logprobs: maybe}\n",
        [],
        ["output.include_logprobs: expected true or false, got 'maybe'"],
    ),
    (
        "wrong-section-type",
        MINIMAL_JOB + "sampling: [1, 2]\n",
        [],
        ["sampling: expected a mapping"],
    ),
    (
        "bad-order",
        MINIMAL_JOB + "order: random\n",
        [],
        ["order: expected one of prefix, input, got 'random'"],
    ),
    (
        "bad-prompt-too-long",
        MINIMAL_JOB + "prompt_too_long: drop\n",
        [],
        ["prompt_too_long: expected one of error, truncate_left, truncate_right, got 'drop'"],
    ),
    (
        "bad-batching",
        MINIMAL_JOB + "engine: {batching: dynamic}\n",
        [],
        ["engine.batching: expected 'continuous' or 'static', got 'dynamic'"],
    ),
    (
        "bad-dtype",
        MINIMAL_JOB + "engine: {dtype: fp8}\n",
        [],
        ["engine.dtype: expected float32, float16 or bfloat16, got 'fp8'"],
    ),
    (
        "invalid-sampling",
        MINIMAL_JOB + "sampling: {top_p: 2}\n",
        [],
        ["sampling.top_p: expected a value in (0, 1], got 2"],
    ),
    (
        "invalid-sampling-by-override",
        MINIMAL_JOB,
        ["sampling.max_tokens=0"],
        ["sampling.max_tokens: expected an integer >= 1, got 0"],
    ),
    (
        "malformed-override",
        MINIMAL_JOB,
        ["sampling.max_tokens"],
        ["malformed override 'sampling.max_tokens'", "key.sub=value"],
    ),
    (
        "override-value-not-yaml",
        MINIMAL_JOB,
        ["sampling.stop=[a"],
        ["malformed override 'sampling.stop=[a'"],
    ),
    (
        "override-through-a-scalar",
        MINIMAL_JOB + "seed: 3\n",
        ["seed.x=1"],
        ["override 'seed.x=1': 'seed' is not a mapping"],
    ),
    ("missing-input", "output: {path: out}\n", [], ["missing required key 'input'"]),
    (
        "missing-output-path",
        "input: {path: d}\noutput: {}\n",
        [],
        ["missing required key 'output.path'"],
    ),
    (
        "prompt-and-messages",
        "input: {path: d, columns: {prompt: p, messages: m}}\noutput: {path: o}\n",
        [],
        ["input.columns: set exactly one of 'prompt' and 'messages'"],
    ),
    (
        "passthrough-clash",
        "input: {path: d, columns: {passthrough: [seed]}}\noutput: {path: o}\n",
        [],
        ["input.columns.passthrough: column 'seed' has the name of an output column"],
    ),
    (
        "ray-unknown-key",
        MINIMAL_JOB + "executor: ray\nray: {num_worker: 2}\n",
        [],
        ["unknown key 'ray.num_worker' (did you mean 'ray.num_workers'?)"],
    ),
    (
        "ray-workers-range",
        MINIMAL_JOB + "executor: ray\nray: {num_workers: 0}\n",
        [],
        ["ray.num_workers: expected an integer >= 1, got 0"],
    ),
    (
        "ray-gpus-type",
        MINIMAL_JOB + "ray: {num_gpus_per_worker: one}\n",
        [],
        ["ray.num_gpus_per_worker: expected a number >= 0, got 'one'"],
    ),
    (
        "ray-retries-negative",
        MINIMAL_JOB,
        ["ray.max_retries=-1"],
        ["ray.max_retries: expected an integer >= 0, got -1"],
    ),
    ("ray-address-empty", MINIMAL_JOB + "ray: {address: ''}\n", [], ["ray.address: expected"]),
    ("ray-not-a-mapping", MINIMAL_JOB + "ray: 4\n", [], ["ray: expected a mapping, got 4"]),
    ("executor-unknown", MINIMAL_JOB + "executor: dask\n", [], ["executor: expected one of local, ray"]),
    (
        "error-rate-range",
        MINIMAL_JOB + "max_error_rate: 1.5\n",
        [],
        ["max_error_rate: expected a number in [0, 1], got 1.5"],
    ),
]


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_bad_job_files(
    tmp_path: Path, text: str, overrides: list[str], expected: list[str]
) -> None:
    path = _job_file(tmp_path, text, name="nightly-job.yaml")
    with pytest.raises(JobConfigError) as info:
        load_job_config(path, overrides)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    for part in expected:
        assert part in message, message
    assert "Traceback" not in message


def test_ray_section(tmp_path: Path) -> None:
    text = MINIMAL_JOB + (
        "executor: ray\nray:\n  address: auto\n  num_workers: 4\n"
        "  num_cpus_per_worker: 0.5\n  num_gpus_per_worker: 1\n  max_retries: 0\n"
    )
    config = load_job_config(_job_file(tmp_path, text))
    assert config.executor == "ray"
    assert config.ray == RayConfig(
        address="auto", num_workers=4, num_cpus_per_worker=0.5, num_gpus_per_worker=1, max_retries=0
    )
    default = load_job_config(_job_file(tmp_path, MINIMAL_JOB, name="plain.yaml"))
    assert default.ray == RayConfig() and default.executor == "local"
    # Where the job runs does not change its rows: a job may resume under another executor.
    assert config.fingerprint_fields() == default.fingerprint_fields()


def test_missing_job_file(tmp_path: Path) -> None:
    with pytest.raises(JobConfigError, match=r"absent\.yaml: cannot read the job file"):
        load_job_config(tmp_path / "absent.yaml")


def test_job_config_from_dict_needs_no_file(tmp_path: Path) -> None:
    source = tmp_path / "virtual.yaml"
    data = {"input": {"path": "in"}, "output": {"path": "out"}, "seed": 5}
    config = job_config_from_dict(data, source=source, base_dir=tmp_path)
    assert (config.seed, config.source, config.base_dir) == (5, source, tmp_path)
    with pytest.raises(JobConfigError, match=r"virtual\.yaml: window_rows: expected an integer"):
        job_config_from_dict({**data, "window_rows": 0}, source=source, base_dir=tmp_path)


_REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_import_job_config_does_not_import_torch() -> None:
    code = "import batchgen.job.config, sys; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
