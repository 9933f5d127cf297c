"""The input shapes users already have, end to end through `batchgen run`, each against the
plain-Parquet job over the same prompts (greedy): token-id prompts, Hive-partitioned folders,
pandas' types (dictionary/large_string/string_view strings, whole-number floats in per-row
sampling params), an OpenAI batch request file, invalid UTF-8, and `generate` over pandas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from batchgen.cli.main import main
from batchgen.io import TIMELINE_NAME
from tests.tiny_models import make_tiny_hf_folder, smollm2_tokenizer

PROMPTS = [
    "Name a river in France.",
    "What is two plus two?",
    "Write one word about the sea.",
    "Name a river in Spain.",
    "Count to three.",
    "What colour is the sky?",
]
IDS = [f"r{i}" for i in range(len(PROMPTS))]
TOPICS = ["geo", "math", "sea", "geo", "math", "sky"]
SAMPLING = {"max_tokens": 4, "temperature": 0}
ENGINE = {"max_num_seqs": 4, "max_num_batched_tokens": 64}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _write(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=3)


def _run(
    tmp_path: Path, model: Path, name: str, inputs: dict[str, Any], out: str | None = None, **extra: Any
) -> dict[str, dict[str, Any]]:
    """Run a job over `inputs` (the job's `input` section); its output rows by id."""
    out = out or f"out-{name}"
    job = {
        "model": str(model),
        "input": {"batch_rows": 4, **inputs},
        "output": {"path": out, "include_token_ids": True},
        "sampling": SAMPLING,
        "engine": ENGINE,
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    assert main(["run", str(path), "--quiet"]) == 0
    shards = [p for p in sorted((tmp_path / out).glob("*.parquet")) if p.name != TIMELINE_NAME]
    rows = [r for p in shards for r in pq.read_table(p).to_pylist()]
    return {r["id"]: r for r in rows}


def _generated(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["output"], row["finish_reason"], row["output_token_ids"], row["usage"]["prompt_tokens"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, model: Path) -> dict[str, tuple[Any, ...]]:
    tmp_path = tmp_path_factory.mktemp("reference")
    _write(tmp_path / "data" / "part-0.parquet", pa.table({"id": IDS, "prompt": PROMPTS, "topic": TOPICS}))
    rows = _run(tmp_path, model, "plain", {"path": "data", "columns": {"passthrough": ["topic"]}})
    assert all(r["error"] is None for r in rows.values())
    return {row_id: _generated(row) for row_id, row in rows.items()}


def test_token_id_prompts(tmp_path: Path, model: Path, reference: dict[str, tuple[Any, ...]]) -> None:
    tokenizer = smollm2_tokenizer()
    token_ids = [tokenizer.encode(p, add_special_tokens=True) for p in PROMPTS]
    table = pa.table(
        {
            "id": [*IDS, "oov", "empty", "null"],
            "ids": pa.array([*token_ids, [1, tokenizer.vocab_size], [], None], pa.list_(pa.int32())),
        }
    )
    _write(tmp_path / "data" / "part-0.parquet", table)
    rows = _run(tmp_path, model, "tokens", {"path": "data", "columns": {"prompt_token_ids": "ids"}})
    assert {i: _generated(rows[i]) for i in IDS} == reference
    for bad in ("oov", "empty", "null"):
        assert rows[bad]["finish_reason"] == "error" and rows[bad]["error"]["code"] == "invalid_prompt"
    assert "outside the vocabulary" in rows["oov"]["error"]["message"]
    # list<int64> works as well
    _write(tmp_path / "data64" / "part-0.parquet", table.cast(pa.schema([("id", pa.string()), ("ids", pa.list_(pa.int64()))])))
    rows = _run(tmp_path, model, "tokens64", {"path": "data64", "columns": {"prompt_token_ids": "ids"}})
    assert {i: _generated(rows[i]) for i in IDS} == reference


def test_hive_partitioned_folder_with_partition_values(tmp_path: Path, model: Path, reference: dict[str, tuple[Any, ...]]) -> None:
    data = tmp_path / "data"
    _write(data / "date=2026-11-29" / "part-0.parquet", pa.table({"id": IDS[:2], "prompt": PROMPTS[:2]}))
    _write(data / "date=2026-11-30" / "part-0.parquet", pa.table({"id": IDS[2:5], "prompt": PROMPTS[2:5]}))
    _write(data / "date=2026-12-01" / "nested" / "part-1.parquet", pa.table({"id": IDS[5:], "prompt": PROMPTS[5:]}))
    (data / "_SUCCESS").write_text("")
    inputs = {"path": "data", "columns": {"passthrough": ["date"]}}
    # a re-run resumes over the same shards
    for _ in range(2):
        rows = _run(tmp_path, model, "hive", inputs, order="input")
        assert {i: _generated(r) for i, r in rows.items()} == reference
        assert [rows[i]["date"] for i in IDS] == ["2026-11-29"] * 2 + ["2026-11-30"] * 3 + ["2026-12-01"]
    outputs = sorted(p.name for p in (tmp_path / "out-hive").glob("*__*.parquet"))
    assert outputs == [
        "date=2026-11-29__part-0.parquet",
        "date=2026-11-30__part-0.parquet",
        "date=2026-12-01__nested__part-1.parquet",
    ]
    # an output folder inside the (recursively read) input folder is refused before any work
    job = {"model": str(model), "input": inputs, "output": {"path": "data/out"}}
    (tmp_path / "inside.yaml").write_text(yaml.safe_dump(job), encoding="utf-8")
    assert main(["run", str(tmp_path / "inside.yaml"), "--quiet"]) == 2
    assert not (data / "out").exists()


def test_pandas_types(tmp_path: Path, model: Path, reference: dict[str, tuple[Any, ...]]) -> None:
    import pandas as pd

    frame = pd.DataFrame(
        {
            "id": IDS[:3],
            "prompt": PROMPTS[:3],
            "topic": pd.Categorical(TOPICS[:3]),
            # a column of dicts with a missing key: pandas/pyarrow give max_tokens as 4.0
            "sp": [{"max_tokens": 4.0, "temperature": 0.0}, {"max_tokens": None, "temperature": 0.0}, None],
        }
    )
    table = pa.Table.from_pandas(frame, preserve_index=False)
    assert pa.types.is_large_string(table.schema.field("prompt").type)
    assert pa.types.is_dictionary(table.schema.field("topic").type)
    assert table.schema.field("sp").type.field("max_tokens").type == pa.float64()
    _write(tmp_path / "data" / "part-0.parquet", table)
    views = pa.table(
        {
            "id": pa.array(IDS[3:], pa.string()).dictionary_encode(),
            "prompt": pa.array(PROMPTS[3:], pa.string_view()),
            "topic": pa.array(TOPICS[3:], pa.string()).dictionary_encode(),
            "sp": pa.array([None] * 3, table.schema.field("sp").type),
        }
    )
    _write(tmp_path / "data" / "part-1.parquet", views)
    columns = {"sampling_params": "sp", "passthrough": ["topic"]}
    rows = _run(tmp_path, model, "pandas", {"path": "data", "columns": columns})
    assert {i: _generated(r) for i, r in rows.items()} == reference
    assert [rows[i]["topic"] for i in IDS] == TOPICS


def test_unknown_sampling_field_stops_at_once(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sp = pa.array([{"max_tokens": 4, "temprature": 0.5}], pa.struct([("max_tokens", pa.int64()), ("temprature", pa.float64())]))
    _write(tmp_path / "data" / "part-0.parquet", pa.table({"id": ["a"], "prompt": ["x"], "sp": sp}))
    job = {"model": str(model), "input": {"path": "data", "columns": {"sampling_params": "sp"}}, "output": {"path": "out"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job), encoding="utf-8")
    assert main(["run", str(tmp_path / "job.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "field 'temprature'" in err and "did you mean 'temperature'" in err and "part-0.parquet" in err
    assert not (tmp_path / "out" / "part-0.parquet").exists()


def test_invalid_utf8_is_an_error_row(tmp_path: Path, model: Path, reference: dict[str, tuple[Any, ...]]) -> None:
    raw = pa.array([p.encode() for p in PROMPTS] + [b"bad \xff\xfe bytes"], pa.binary())
    # pyarrow does not validate UTF-8 when a binary buffer is viewed (or read) as string
    prompts = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers(), null_count=0)
    _write(tmp_path / "data" / "part-0.parquet", pa.table({"id": [*IDS, "bad"], "prompt": prompts}))
    rows = _run(tmp_path, model, "utf8", {"path": "data"})
    assert {i: _generated(rows[i]) for i in IDS} == reference
    assert rows["bad"]["error"]["code"] == "invalid_utf8"
    assert "column 'prompt'" in rows["bad"]["error"]["message"]


def test_openai_request_file_in_a_job(tmp_path: Path, model: Path, reference: dict[str, tuple[Any, ...]]) -> None:
    lines = [
        json.dumps({"custom_id": i, "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": p}})
        for i, p in zip(IDS, PROMPTS, strict=True)
    ]
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / "batch.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = _run(tmp_path, model, "openai", {"path": "requests", "format": "openai_jsonl"})
    assert {i: _generated(r) for i, r in rows.items()} == reference
    assert [rows[i]["line"] for i in IDS] == list(range(1, 7)) and rows["r0"]["url"] == "/v1/completions"
    # and out as response lines, one per request, same texts
    rows_jsonl = tmp_path / "openai-out.yaml"
    job = {
        "model": str(model),
        "input": {"path": "requests", "format": "openai_jsonl"},
        "output": {"path": "out-jsonl", "format": "openai_jsonl"},
        "sampling": SAMPLING,
        "engine": ENGINE,
    }
    rows_jsonl.write_text(yaml.safe_dump(job), encoding="utf-8")
    assert main(["run", str(rows_jsonl), "--quiet"]) == 0
    responses = [json.loads(x) for x in (tmp_path / "out-jsonl" / "batch.jsonl").read_text().splitlines()]
    texts = {r["custom_id"]: r["response"]["body"]["choices"][0]["text"] for r in responses}
    assert texts == {i: ref[0] for i, ref in reference.items()}


def test_generate_takes_and_returns_pandas(model: Path, reference: dict[str, tuple[Any, ...]]) -> None:
    import pandas as pd

    from batchgen import generate

    frame = pd.DataFrame({"key": IDS, "prompt": PROMPTS})
    out = generate(frame, model=str(model), sampling=SAMPLING, include_token_ids=True, use_tqdm=False, **ENGINE)
    assert isinstance(out, pd.DataFrame)
    assert list(out["key"]) == IDS
    assert list(out["output"]) == [reference[i][0] for i in IDS]
    frame["sp"] = [{"max_tokens": 4, "temprature": 0.0}] * len(IDS)
    with pytest.raises(ValueError, match="field 'temprature' that is not a sampling parameter"):
        generate(frame, model=str(model), sampling_params_column="sp", use_tqdm=False)
