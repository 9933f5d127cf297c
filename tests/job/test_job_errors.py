"""`batchgen run job.yaml` on bad input: the job-level error corpus and per-row errors.

Job-level problems (the job file, the input files, the output folder, the model) end the run at
once with exit code 2 and one message on stderr that names the file, the key or column, and what
was expected -- never a traceback, and nothing written. Bad rows become output rows with
finish_reason "error" and an error code, and the job goes on (exit 0); too many of them stop it
(exit 1) without leaving a partial shard.

Everything runs in-process through `batchgen.cli.main.main` with one tiny model for the module.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from batchgen.cli.main import main
from tests.job.helpers import final_shards, read_outputs, temp_files, write_job
from tests.tiny_models import make_tiny_hf_folder

N = 2  # samples per row in every job here
_LONG_TEXT = " ".join(f"word{i} and more" for i in range(80))  # far over 64 tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(
        tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64
    )


def job_data(model: Path | str, **changes: Any) -> dict[str, Any]:
    """A small valid job (input ``in/``, output ``out/``); top-level `changes` replace keys."""
    data: dict[str, Any] = {
        "model": str(model),
        "input": {"path": "in", "batch_rows": 4},
        "output": {"path": "out"},
        "sampling": {"max_tokens": 4, "temperature": 0.7, "n": N},
        "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 16},
    }
    data.update(changes)
    return data


def write_shard(folder: Path, name: str, columns: dict[str, pa.Array | list[Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    pq.write_table(pa.table(columns), path)
    return path


def run_main(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the CLI in-process; an escaping exception is what a user would see as a traceback."""
    try:
        rc = main(list(argv))
    except (Exception, SystemExit) as exc:
        out, err = capsys.readouterr()
        pytest.fail(
            f"main raised {exc!r} (a user would see a traceback)\nstdout: {out}\nstderr: {err}"
        )
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def run_job_file(
    job: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, str]:
    return run_main(["run", str(job), "--quiet", *extra], capsys)


def assert_one_error(err: str, mentions: Sequence[str]) -> None:
    """stderr holds exactly one error message, and it mentions every string in `mentions`."""
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1, err
    for text in mentions:
        assert text in err, f"{text!r} not in the message: {err}"


def _usage(table: pa.Table, name: str) -> list[int]:
    values: list[int] = pc.struct_field(table.column("usage").combine_chunks(), name).to_pylist()
    return values


def _codes(table: pa.Table) -> list[str | None]:
    error = table.column("error").combine_chunks()
    codes = pc.struct_field(error, "code").to_pylist()
    return [
        None if valid is False else code
        for code, valid in zip(codes, error.is_valid().to_pylist(), strict=True)
    ]


def run_one_shard_ok(
    job: Path, capsys: pytest.CaptureFixture[str], ids: list[Any], samples: list[int] | None = None
) -> pa.Table:
    """Run a one-shard job that must succeed; check that every input row yields one output row
    per sample, in input order, and return the shard's rows."""
    rc, out, err = run_job_file(job, capsys)
    assert rc == 0, err
    assert "committed" in out  # the end summary
    out_dir = job.parent / "out"
    assert temp_files(out_dir) == []
    tables = read_outputs(out_dir)
    assert list(tables) == ["part-0.parquet"]
    table = tables["part-0.parquet"]
    samples = samples or [N] * len(ids)
    assert table.num_rows == sum(samples)  # no row lost
    expected = [(i, s) for i, n in zip(ids, samples, strict=True) for s in range(n)]
    got = list(
        zip(table.column("id").to_pylist(), table.column("sample_index").to_pylist(), strict=True)
    )
    assert got == expected
    finish = table.column("finish_reason").to_pylist()
    codes = _codes(table)
    for reason, code in zip(finish, codes, strict=True):
        assert (reason == "error") == (code is not None)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["shards"]["part-0.parquet"]["num_output_rows"] == table.num_rows
    return table


def per_row_codes(table: pa.Table) -> list[str | None]:
    """The error code of each input row (all samples of a row must agree)."""
    by_row: list[str | None] = []
    ids = table.column("id").to_pylist()
    sample = table.column("sample_index").to_pylist()
    for idx, code in enumerate(_codes(table)):
        if sample[idx] == 0:
            by_row.append(code)
        else:
            assert ids[idx] == ids[idx - 1] and code == by_row[-1]
    return by_row


# --- job-level errors: exit 2, one message, nothing written --------------------------------------

Case = Callable[[Path, Path], tuple[list[str], list[str]]]
"""(tmp folder, model folder) -> (extra CLI args, strings the message must contain)."""


def _good_input(tmp: Path) -> None:
    write_shard(
        tmp / "in", "part-0.parquet", {"id": [1, 2], "prompt": ["Hello there", "Tell me more"]}
    )


def _case_bad_yaml(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    (tmp / "job.yaml").write_text(f"model: {model}\ninput: {{path: in\noutput:\n  path: [out\n")
    return [], [str(tmp / "job.yaml"), "invalid YAML", "line"]


def _case_not_a_mapping(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    (tmp / "job.yaml").write_text("- model\n- input\n")
    return [], [str(tmp / "job.yaml"), "expected a mapping"]


def _case_unknown_key(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    write_job(tmp / "job.yaml", job_data(model, sampling={"max_token": 4}))
    return [], [str(tmp / "job.yaml"), "sampling.max_token", "did you mean 'sampling.max_tokens'"]


def _case_wrong_type(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    write_job(tmp / "job.yaml", job_data(model, engine={"device": "cpu", "max_num_seqs": "many"}))
    return [], [str(tmp / "job.yaml"), "engine.max_num_seqs", "expected an integer", "many"]


def _case_missing_required_key(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    data = job_data(model)
    del data["output"]
    write_job(tmp / "job.yaml", data)
    return [], [str(tmp / "job.yaml"), "missing required key 'output'"]


def _case_malformed_override(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    write_job(tmp / "job.yaml", job_data(model))
    return ["--set", "sampling.max_tokens"], [
        str(tmp / "job.yaml"),
        "sampling.max_tokens",
        "key.sub=value",
    ]


def _case_bad_choice(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    write_job(tmp / "job.yaml", job_data(model, prompt_too_long="truncate"))
    return [], [str(tmp / "job.yaml"), "prompt_too_long", "truncate_left"]


def _case_missing_input_folder(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    write_job(tmp / "job.yaml", job_data(model, input={"path": "nowhere"}))
    return [], ["nowhere", str(tmp / "nowhere"), "does not exist"]


def _case_empty_input_folder(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    (tmp / "in").mkdir()
    (tmp / "in" / "notes.txt").write_text("not a shard")
    write_job(tmp / "job.yaml", job_data(model))
    return [], [str(tmp / "in"), "no Parquet files", "*.parquet"]


def _case_corrupt_parquet(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    (tmp / "in" / "part-1.parquet").write_bytes(b"PAR1 this is not a Parquet file PAR1")
    write_job(tmp / "job.yaml", job_data(model))
    return [], [str(tmp / "in" / "part-1.parquet"), "not a readable Parquet file"]


def _case_truncated_parquet(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    good = (tmp / "in" / "part-0.parquet").read_bytes()
    (tmp / "in" / "part-1.parquet").write_bytes(good[: len(good) // 2])
    write_job(tmp / "job.yaml", job_data(model))
    return [], [str(tmp / "in" / "part-1.parquet"), "not a readable Parquet file"]


def _case_missing_id_column(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    write_shard(tmp / "in", "part-0.parquet", {"key": [1, 2], "prompt": ["a", "b"]})
    write_job(tmp / "job.yaml", job_data(model))
    return [], [
        str(tmp / "in" / "part-0.parquet"),
        "no column 'id'",
        "the id column",
        "key, prompt",
    ]


def _case_missing_prompt_column(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    write_shard(tmp / "in", "part-0.parquet", {"id": [1, 2], "text": ["a", "b"]})
    write_job(tmp / "job.yaml", job_data(model))
    return [], [str(tmp / "in" / "part-0.parquet"), "no column 'prompt'", "the prompt column"]


def _case_prompt_int64(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    write_shard(
        tmp / "in", "part-0.parquet", {"id": [1, 2], "prompt": pa.array([3, 4], pa.int64())}
    )
    write_job(tmp / "job.yaml", job_data(model))
    return [], [str(tmp / "in" / "part-0.parquet"), "'prompt'", "int64", "expected string"]


def _case_id_float(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    write_shard(tmp / "in", "part-0.parquet", {"id": [1.5, 2.5], "prompt": ["a", "b"]})
    write_job(tmp / "job.yaml", job_data(model))
    return [], [str(tmp / "in" / "part-0.parquet"), "'id'", "double", "integer or string"]


def _case_messages_not_a_list(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    write_shard(tmp / "in", "part-0.parquet", {"id": [1, 2], "chat": ["hi", "there"]})
    write_job(
        tmp / "job.yaml", job_data(model, input={"path": "in", "columns": {"messages": "chat"}})
    )
    return [], [
        str(tmp / "in" / "part-0.parquet"),
        "'chat'",
        "messages",
        "struct<role: string, content: string>",
    ]


def _case_sampling_params_not_a_struct(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    write_shard(
        tmp / "in", "part-0.parquet", {"id": [1, 2], "prompt": ["a", "b"], "sp": [0.5, 0.7]}
    )
    write_job(
        tmp / "job.yaml",
        job_data(model, input={"path": "in", "columns": {"sampling_params": "sp"}}),
    )
    return [], [str(tmp / "in" / "part-0.parquet"), "'sp'", "expected a struct"]


def _case_output_is_a_file(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    (tmp / "out").write_text("a file where the output folder should be")
    write_job(tmp / "job.yaml", job_data(model))
    return [], [str(tmp / "out"), "not a folder"]


def _case_output_under_a_file(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    (tmp / "blocker").write_text("a file")
    write_job(tmp / "job.yaml", job_data(model, output={"path": "blocker/out"}))
    return [], [str(tmp / "blocker" / "out"), "cannot create output folder"]


def _case_model_missing(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    write_job(tmp / "job.yaml", job_data(tmp / "no-such-model"))
    return [], [str(tmp / "job.yaml"), "model", str(tmp / "no-such-model"), "does not exist"]


def _case_model_folder_without_files(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    (tmp / "empty-model").mkdir()
    write_job(tmp / "job.yaml", job_data(tmp / "empty-model"))
    return [], [str(tmp / "empty-model"), "config.json"]


def _case_model_file_not_gguf(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    (tmp / "model.bin").write_bytes(b"\0" * 64)
    write_job(tmp / "job.yaml", job_data(tmp / "model.bin"))
    return [], [str(tmp / "model.bin"), ".gguf"]


def _case_max_model_len_over_model_limit(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    write_job(tmp / "job.yaml", job_data(model, engine={"device": "cpu", "max_model_len": 100_000}))
    return [], ["max_model_len", "100000", "2048"]


def _case_unknown_device(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    write_job(tmp / "job.yaml", job_data(model, engine={"device": "gpu", "max_model_len": 256}))
    return [], [str(tmp / "job.yaml"), "engine.device", "'gpu'"]


def _case_cuda_without_cuda(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    write_job(tmp / "job.yaml", job_data(model, engine={"device": "cuda", "max_model_len": 256}))
    return [], [str(tmp / "job.yaml"), "engine.device", "'cuda'", "no CUDA device"]


def _case_triton_on_cpu(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    engine = {"device": "cpu", "attention_backend": "triton", "max_model_len": 256}
    write_job(tmp / "job.yaml", job_data(model, engine=engine))
    return [], [str(tmp / "job.yaml"), "engine.attention_backend", "triton", "CPU"]


def _case_model_garbage_gguf(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    (tmp / "model.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 8)
    write_job(tmp / "job.yaml", job_data(tmp / "model.gguf"))
    return [], [str(tmp / "job.yaml"), "model", str(tmp / "model.gguf"), "cannot be loaded"]


def _case_model_truncated_weights(tmp: Path, model: Path) -> tuple[list[str], list[str]]:
    _good_input(tmp)
    broken = tmp / "broken-model"
    shutil.copytree(model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    write_job(tmp / "job.yaml", job_data(broken))
    return [], ["model", str(broken), "cannot be loaded"]


JOB_ERRORS: dict[str, Case] = {
    "bad-yaml-syntax": _case_bad_yaml,
    "yaml-not-a-mapping": _case_not_a_mapping,
    "unknown-key": _case_unknown_key,
    "wrong-type": _case_wrong_type,
    "missing-required-key": _case_missing_required_key,
    "malformed-override": _case_malformed_override,
    "bad-choice": _case_bad_choice,
    "missing-input-folder": _case_missing_input_folder,
    "empty-input-folder": _case_empty_input_folder,
    "corrupt-parquet": _case_corrupt_parquet,
    "truncated-parquet": _case_truncated_parquet,
    "missing-id-column": _case_missing_id_column,
    "missing-prompt-column": _case_missing_prompt_column,
    "prompt-column-int64": _case_prompt_int64,
    "id-column-float": _case_id_float,
    "messages-column-not-a-list": _case_messages_not_a_list,
    "sampling-params-column-not-a-struct": _case_sampling_params_not_a_struct,
    "output-path-is-a-file": _case_output_is_a_file,
    "output-path-under-a-file": _case_output_under_a_file,
    "model-missing": _case_model_missing,
    "model-folder-without-files": _case_model_folder_without_files,
    "model-file-not-gguf": _case_model_file_not_gguf,
    "max-model-len-over-model-limit": _case_max_model_len_over_model_limit,
    "unknown-device": _case_unknown_device,
    "cuda-device-without-cuda": _case_cuda_without_cuda,
    "triton-backend-on-cpu": _case_triton_on_cpu,
    "model-garbage-gguf": _case_model_garbage_gguf,
    "model-truncated-weights": _case_model_truncated_weights,
}


@pytest.mark.parametrize("case", list(JOB_ERRORS))
def test_bad_job_fails_at_once_with_one_clear_message(
    case: str, tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if case == "cuda-device-without-cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    extra, mentions = JOB_ERRORS[case](tmp_path, model_dir)
    rc, out, err = run_job_file(tmp_path / "job.yaml", capsys, *extra)
    assert rc == 2, err
    assert out == ""
    assert_one_error(err, mentions)
    out_dir = tmp_path / "out"
    if out_dir.is_dir():
        assert final_shards(out_dir) == []
        assert temp_files(out_dir) == []


# --- per-row errors: exit 0, one output row per sample, the right code ----------------------------


def test_bad_prompts_and_duplicate_ids_become_error_rows(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        (10, "Hello, how are you?", "ok", None),
        (11, None, "null", "invalid_prompt"),
        (12, "", "empty", "invalid_prompt"),
        (13, "  \n\t ", "blank", "invalid_prompt"),
        (14, "What is the capital of France?", "ok", None),
        (14, "Same id again", "dup", "duplicate_id"),
        (16, "Another good row", "ok", None),
        (10, "The first id, a third time (another read batch)", "dup", "duplicate_id"),
        (15, "Last good row", "ok", None),
    ]
    ids = [r[0] for r in rows]
    write_shard(
        tmp_path / "in",
        "part-0.parquet",
        {
            "id": pa.array(ids, pa.int64()),
            "prompt": pa.array([r[1] for r in rows], pa.string()),
            "tag": pa.array([r[2] for r in rows], pa.string()),
        },
    )
    write_job(
        tmp_path / "job.yaml",
        job_data(model_dir, input={"path": "in", "columns": {"passthrough": ["tag"]}}),
    )
    table = run_one_shard_ok(tmp_path / "job.yaml", capsys, ids)
    assert per_row_codes(table) == [r[3] for r in rows]
    # Passthrough values travel with error rows too.
    assert table.column("tag").to_pylist() == [r[2] for r in rows for _ in range(N)]
    finish = table.column("finish_reason").to_pylist()
    outputs = table.column("output").to_pylist()
    messages = pc.struct_field(table.column("error").combine_chunks(), "message").to_pylist()
    completion = _usage(table, "completion_tokens")
    for i, code in enumerate(_codes(table)):
        if code is None:
            assert (
                finish[i] in ("stop", "length")
                and isinstance(outputs[i], str)
                and completion[i] >= 1
            )
        else:
            assert (
                finish[i] == "error" and outputs[i] is None and completion[i] == 0 and messages[i]
            )
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rows"]["error_codes"] == {"invalid_prompt": 3, "duplicate_id": 2}
    assert summary["rows"]["output_rows"] == len(rows) * N


def test_null_id_becomes_an_error_row(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [1, None, 2]
    write_shard(
        tmp_path / "in",
        "part-0.parquet",
        {
            "id": pa.array(ids, pa.int64()),
            "prompt": ["First prompt", "A row without an id", "Third prompt"],
        },
    )
    write_job(tmp_path / "job.yaml", job_data(model_dir))
    # The id column keeps the input's type: the row comes out with a null id.
    table = run_one_shard_ok(tmp_path / "job.yaml", capsys, ids)
    assert per_row_codes(table) == [None, "invalid_id", None]
    assert table.schema.field("id").type == pa.int64()


def test_empty_shard_gets_an_empty_output_shard(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_shard(
        tmp_path / "in",
        "part-0.parquet",
        {"id": pa.array([], pa.int64()), "prompt": pa.array([], pa.string())},
    )
    write_shard(
        tmp_path / "in", "part-1.parquet", {"id": pa.array([7], pa.int64()), "prompt": ["Only row"]}
    )
    write_job(tmp_path / "job.yaml", job_data(model_dir))
    rc, out, err = run_job_file(tmp_path / "job.yaml", capsys)
    assert rc == 0, err
    assert "2 committed" in out
    tables = read_outputs(tmp_path / "out")
    assert sorted(tables) == ["part-0.parquet", "part-1.parquet"]
    assert tables["part-0.parquet"].num_rows == 0
    assert tables["part-0.parquet"].schema.equals(tables["part-1.parquet"].schema)
    assert tables["part-1.parquet"].num_rows == N
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert sorted(manifest["shards"]) == ["part-0.parquet", "part-1.parquet"]


@pytest.mark.parametrize("policy", ["error", "truncate_left", "truncate_right"])
def test_prompt_too_long_policies(
    policy: str, tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    max_model_len = 64
    prompts = [
        "Short prompt",
        _LONG_TEXT,
        "Another short one",
        " ".join(["token"] * 61),  # fits, but leaves no room for max_tokens
        _LONG_TEXT[::-1],
    ]
    long_rows = [False, True, False, False, True]
    ids = list(range(len(prompts)))
    write_shard(
        tmp_path / "in", "part-0.parquet", {"id": pa.array(ids, pa.int64()), "prompt": prompts}
    )
    write_job(
        tmp_path / "job.yaml",
        job_data(
            model_dir,
            prompt_too_long=policy,
            engine={"device": "cpu", "max_model_len": max_model_len, "max_num_seqs": 8},
        ),
    )
    table = run_one_shard_ok(tmp_path / "job.yaml", capsys, ids)
    codes = per_row_codes(table)
    if policy == "error":
        assert codes == ["prompt_too_long" if is_long else None for is_long in long_rows]
    else:
        assert codes == [None] * len(prompts)
    prompt_tokens = _usage(table, "prompt_tokens")
    completion = _usage(table, "completion_tokens")
    for i, code in enumerate(_codes(table)):
        if code is None:
            assert 1 <= prompt_tokens[i] <= max_model_len - 1
            assert completion[i] >= 1
            assert prompt_tokens[i] + completion[i] <= max_model_len


def test_per_row_sampling_params(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sp_type = pa.struct(
        [
            pa.field("temperature", pa.float64()),
            pa.field("top_p", pa.float64()),
            pa.field("max_tokens", pa.int64()),
            pa.field("n", pa.int64()),
        ]
    )
    overrides = [
        None,
        {"temperature": -1.0, "top_p": None, "max_tokens": None, "n": None},
        {"temperature": None, "top_p": 2.0, "max_tokens": None, "n": None},
        {"temperature": 0.0, "top_p": None, "max_tokens": 2, "n": None},
        {"temperature": None, "top_p": None, "max_tokens": None, "n": 3},
        {"temperature": None, "top_p": None, "max_tokens": None, "n": None},
        {"temperature": None, "top_p": None, "max_tokens": 0, "n": None},
    ]
    ids = list(range(len(overrides)))
    write_shard(
        tmp_path / "in",
        "part-0.parquet",
        {
            "id": pa.array(ids, pa.int64()),
            "prompt": [f"Prompt number {i} about the sea" for i in ids],
            "sp": pa.array(overrides, sp_type),
        },
    )
    write_job(
        tmp_path / "job.yaml",
        job_data(model_dir, input={"path": "in", "columns": {"sampling_params": "sp"}}),
    )
    samples = [N, N, N, N, 3, N, N]
    table = run_one_shard_ok(tmp_path / "job.yaml", capsys, ids, samples)
    codes = per_row_codes(table)
    bad = "invalid_sampling_params"
    assert codes == [None, bad, bad, None, None, None, bad]
    messages = pc.struct_field(table.column("error").combine_chunks(), "message").to_pylist()
    by_id = table.column("id").to_pylist()
    assert "temperature" in messages[by_id.index(1)]
    assert "top_p" in messages[by_id.index(2)]
    assert "max_tokens" in messages[by_id.index(6)]
    completion = _usage(table, "completion_tokens")
    assert [c for c, i in zip(completion, by_id, strict=True) if i == 3] and all(
        1 <= c <= 2 for c, i in zip(completion, by_id, strict=True) if i == 3
    )
    # Greedy override: both samples of row 3 are the same text.
    row3 = [o for o, i in zip(table.column("output").to_pylist(), by_id, strict=True) if i == 3]
    assert row3[0] == row3[1]


def _chat_shard(tmp: Path, chats: list[Any]) -> list[int]:
    message = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
    ids = list(range(100, 100 + len(chats)))
    write_shard(
        tmp / "in",
        "part-0.parquet",
        {"id": pa.array(ids, pa.int64()), "chat": pa.array(chats, pa.list_(message))},
    )
    return ids


def test_malformed_messages_become_error_rows(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chats: list[Any] = [
        [{"role": "user", "content": "Hi there"}],
        [{"role": None, "content": "who am I?"}],
        None,
        [],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        [{"role": "user", "content": None}],
    ]
    ids = _chat_shard(tmp_path, chats)
    write_job(
        tmp_path / "job.yaml",
        job_data(model_dir, input={"path": "in", "columns": {"messages": "chat"}}),
    )
    table = run_one_shard_ok(tmp_path / "job.yaml", capsys, ids)
    bad = "invalid_messages"
    assert per_row_codes(table) == [None, bad, bad, bad, None, bad]
    messages = pc.struct_field(table.column("error").combine_chunks(), "message").to_pylist()
    assert "role" in messages[2]  # row 101, sample 0


def test_broken_chat_template_becomes_error_rows(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "broken-template"
    shutil.copytree(model_dir, model)
    for name in ("chat_template.jinja", "chat_template.json"):
        (model / name).unlink(missing_ok=True)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% if messages %}{{ raise_exception('boom') }}{% endif %}"
    config_path.write_text(json.dumps(config))
    chats = [[{"role": "user", "content": f"Question {i}"}] for i in range(4)]
    ids = _chat_shard(tmp_path, chats)
    write_job(
        tmp_path / "job.yaml",
        job_data(model, input={"path": "in", "columns": {"messages": "chat"}}),
    )
    table = run_one_shard_ok(tmp_path / "job.yaml", capsys, ids)
    assert per_row_codes(table) == ["chat_template_error"] * len(chats)
    messages = pc.struct_field(table.column("error").combine_chunks(), "message").to_pylist()
    assert all("boom" in m for m in messages)


# --- the job stops: error rate, Ctrl-C ------------------------------------------------------------


def _assert_nothing_partial(out_dir: Path, input_rows: dict[str, int]) -> None:
    """No temporary file; every final shard is whole (reads back with all its rows) and the
    manifest lists only final shards."""
    assert temp_files(out_dir) == []
    for name, table in read_outputs(out_dir).items():
        assert table.num_rows == input_rows[name] * N
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert set(manifest["shards"]) <= {p.name for p in final_shards(out_dir)}


def test_error_rate_stops_the_job(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_shard(
        tmp_path / "in",
        "part-0.parquet",
        {"id": pa.array(range(12), pa.int64()), "prompt": [f"Good prompt {i}" for i in range(12)]},
    )
    bad_prompts = [None if i % 6 else f"Fine {i}" for i in range(30)]
    write_shard(
        tmp_path / "in",
        "part-1.parquet",
        {"id": pa.array(range(100, 130), pa.int64()), "prompt": pa.array(bad_prompts, pa.string())},
    )
    write_job(
        tmp_path / "job.yaml", job_data(model_dir, max_error_rate=0.2, min_rows_for_error_rate=10)
    )
    rc, out, err = run_job_file(tmp_path / "job.yaml", capsys)
    assert rc == 1, err
    assert out == ""
    assert_one_error(err, ["stopping early", "max_error_rate", "invalid_prompt"])
    _assert_nothing_partial(tmp_path / "out", {"part-0.parquet": 12, "part-1.parquet": 30})
    assert not (tmp_path / "out" / "part-1.parquet").exists()


def test_ctrl_c_exits_130_and_leaves_nothing_partial(
    tmp_path: Path,
    model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batchgen.io import writer

    write_shard(
        tmp_path / "in",
        "part-0.parquet",
        {"id": pa.array(range(24), pa.int64()), "prompt": [f"Prompt {i}" for i in range(24)]},
    )
    write_job(tmp_path / "job.yaml", job_data(model_dir))
    real_write = writer.OutputShardWriter.write
    calls = []

    def write(self: writer.OutputShardWriter, batch: pa.RecordBatch) -> None:
        calls.append(batch.num_rows)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_write(self, batch)

    monkeypatch.setattr(writer.OutputShardWriter, "write", write)
    rc, out, err = run_job_file(tmp_path / "job.yaml", capsys)
    assert rc == 130
    assert out == ""
    assert "interrupted" in err
    assert len(calls) == 2
    _assert_nothing_partial(tmp_path / "out", {"part-0.parquet": 24})
    assert final_shards(tmp_path / "out") == []


# --- disk full: setup (exit 2) and while running (exit 1), nothing partial ---------------------


def _no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(28, "No space left on device")


def test_disk_full_while_writing_a_shard_is_a_message_and_leaves_nothing_partial(
    tmp_path: Path,
    model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batchgen.io import writer

    write_shard(
        tmp_path / "in",
        "part-0.parquet",
        {"id": pa.array(range(12), pa.int64()), "prompt": [f"Prompt {i}" for i in range(12)]},
    )
    write_job(tmp_path / "job.yaml", job_data(model_dir))
    monkeypatch.setattr(writer.pq.ParquetWriter, "write_batch", _no_space)
    rc, out, err = run_job_file(tmp_path / "job.yaml", capsys)
    assert rc == 1, err
    assert out == ""
    assert_one_error(err, [str(tmp_path / "out" / "part-0.parquet"), "No space left on device"])
    _assert_nothing_partial(tmp_path / "out", {"part-0.parquet": 12})
    assert final_shards(tmp_path / "out") == []


def test_disk_full_when_creating_the_manifest_is_a_setup_error(
    tmp_path: Path,
    model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batchgen.io import manifest

    _good_input(tmp_path)
    write_job(tmp_path / "job.yaml", job_data(model_dir))
    monkeypatch.setattr(manifest, "write_json_atomic", _no_space)
    rc, out, err = run_job_file(tmp_path / "job.yaml", capsys)
    assert rc == 2, err
    assert out == ""
    assert_one_error(err, [str(tmp_path / "out"), "No space left on device"])
    assert final_shards(tmp_path / "out") == []
    assert temp_files(tmp_path / "out") == []
