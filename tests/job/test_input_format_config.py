"""Job-file keys of the input formats: `input.format` / `output.format`,
`columns.prompt_token_ids`, and the errors that name them."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchgen.io import ColumnMap
from batchgen.io.openai_batch import OPENAI_COLUMNS
from batchgen.job.config import JobConfigError
from batchgen.job.config_file import job_config_with_overrides, load_job_config


def test_token_id_column(tmp_path: Path) -> None:
    config = load_job_config(_write(tmp_path, "input: {path: d, columns: {prompt_token_ids: ids}}\noutput: {path: o}\n"))
    assert config.io.columns == ColumnMap(prompt=None, prompt_token_ids="ids")
    assert config.fingerprint_fields()["columns"]["prompt_token_ids"] == "ids"
    assert "format" not in config.fingerprint_fields()  # Parquet jobs fingerprint as before


def test_openai_formats(tmp_path: Path) -> None:
    config = load_job_config(
        _write(tmp_path, "input: {path: r.jsonl, format: openai_jsonl}\noutput: {path: o, format: openai_jsonl}\n")
    )
    assert (config.io.input_format, config.io.output_format) == ("openai_jsonl", "openai_jsonl")
    assert config.io.columns == OPENAI_COLUMNS
    assert config.fingerprint_fields()["format"] == {"input": "openai_jsonl", "output": "openai_jsonl"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("input: {path: d, format: csv}\noutput: {path: o}\n", "input.format: expected one of parquet, openai_jsonl, got 'csv'"),
        ("input: {path: d}\noutput: {path: o, format: openai_jsonl}\n", "output.format: openai_jsonl needs input.format: openai_jsonl"),
        (
            "input: {path: d, format: openai_jsonl, columns: {id: x}}\noutput: {path: o}\n",
            "input.columns: not used with input.format openai_jsonl",
        ),
        (
            "input: {path: d, columns: {prompt: p, prompt_token_ids: ids}}\noutput: {path: o}\n",
            "input.columns: set exactly one of 'prompt' and 'messages' (or 'prompt_token_ids' alone)",
        ),
        ("input: {path: d, columns: {prompt_ids: ids}}\noutput: {path: o}\n", "did you mean 'input.columns.prompt_token_ids'"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(JobConfigError) as info:
        load_job_config(_write(tmp_path, text))
    assert message in str(info.value) and str(tmp_path / "job.yaml") in str(info.value)


def test_overrides_on_a_built_job(tmp_path: Path) -> None:
    data = {"input": {"path": "r.jsonl", "format": "openai_jsonl"}, "output": {"path": "o", "format": "openai_jsonl"}}
    config = job_config_with_overrides(data, ["engine.max_num_seqs=3"], source=Path("run-batch"), base_dir=tmp_path)
    assert config.scheduler.max_num_seqs == 3
    with pytest.raises(JobConfigError, match="run-batch: unknown key 'engine.max_seqs'"):
        job_config_with_overrides(data, ["engine.max_seqs=3"], source=Path("run-batch"), base_dir=tmp_path)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_bf16_linear_layers_change_the_fingerprint_and_float32_jobs_keep_theirs(tmp_path: Path) -> None:
    # bfloat16 linear layers change output rows, so a resumed job must not mix them with float32
    # rows; jobs that do not set the key fingerprint exactly as before it existed.
    base = "input: {path: d}\noutput: {path: o}\n"
    plain = load_job_config(_write(tmp_path, base)).fingerprint_fields()
    assert "linear_dtype" not in plain["runner"]
    f32 = load_job_config(_write(tmp_path, base + "engine: {linear_dtype: float32}\n")).fingerprint_fields()
    assert f32 == plain
    bf16 = load_job_config(_write(tmp_path, base + "engine: {linear_dtype: bfloat16}\n")).fingerprint_fields()
    assert bf16["runner"]["linear_dtype"] == "bfloat16" and bf16 != plain
