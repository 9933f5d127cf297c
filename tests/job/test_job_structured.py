"""Structured output in jobs (issue 22): the job-level `sampling.structured_outputs`, per-row
schemas through the `sampling_params` struct column (each row its own, the schema as a string),
`bad_structured_output` error rows, exit 2 naming the key for a bad job-level setting, and the
summary's and report's counts (constrained, completed their grammar, cut by length)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen import generate
from batchgen.cli.main import main
from batchgen.engine.structured.grammar import StructuredOutputError
from tests.tiny_models import make_tiny_hf_folder

LABEL = {"type": "object", "properties": {"label": {"enum": ["spam", "ham"]}}, "required": ["label"], "additionalProperties": False}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
STRUCTURED_TYPE = pa.struct(
    [
        pa.field("json", pa.string()),
        pa.field("regex", pa.string()),
        pa.field("choice", pa.list_(pa.string())),
        pa.field("grammar", pa.string()),
        pa.field("json_object", pa.bool_()),
    ]
)
SAMPLING_TYPE = pa.struct([pa.field("max_tokens", pa.int64()), pa.field("structured_outputs", STRUCTURED_TYPE)])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"))


def _structured(**kind: object) -> dict[str, object]:
    return {"json": None, "regex": None, "choice": None, "grammar": None, "json_object": None, **kind}


PER_ROW = [
    {"max_tokens": 40, "structured_outputs": _structured(json=json.dumps(PERSON))},
    {"max_tokens": 40, "structured_outputs": _structured(regex=r"[0-9]{3}-[a-z]{2}")},
    {"max_tokens": 40, "structured_outputs": _structured(choice=["red", "green", "blue"])},
    {"max_tokens": 40, "structured_outputs": _structured(grammar='start: "yes" | "no" | "maybe"')},
    {"max_tokens": 40, "structured_outputs": None},  # the job's setting (LABEL)
    {"max_tokens": 40, "structured_outputs": _structured(json_object=False)},  # no kind set: the job's too
    {"max_tokens": 40, "structured_outputs": _structured(json=json.dumps({"type": "strnig"}))},  # rejected
    {"max_tokens": 40, "structured_outputs": _structured(regex="a", choice=["a"])},  # two kinds
    {"max_tokens": 40, "structured_outputs": _structured(json="{not json")},
    {"max_tokens": 2, "structured_outputs": _structured(json=json.dumps(PERSON))},  # cut by length
]


def _check_row(row: dict[str, object], spec: dict[str, object] | None) -> None:
    """A stopped row matches its constraint (`spec` None: the job's LABEL schema)."""
    assert row["finish_reason"] == "stop", row
    text = str(row["output"])
    structured = spec or {"json": json.dumps(LABEL)}
    if structured.get("json") is not None:
        jsonschema.validate(json.loads(text), json.loads(str(structured["json"])))
    elif structured.get("regex") is not None:
        assert re.fullmatch(str(structured["regex"]), text)
    elif structured.get("choice") is not None:
        assert text in structured["choice"]  # type: ignore[operator]
    else:
        assert text in ("yes", "no", "maybe")


def test_generate_per_row_schemas_and_error_rows(model: Path) -> None:
    table = pa.table(
        {"prompt": [f"row {i}:" for i in range(len(PER_ROW))], "sampling_params": pa.array(PER_ROW, SAMPLING_TYPE)}
    )
    out = generate(
        table,
        model=str(model),
        sampling={"temperature": 0, "structured_outputs": {"json": LABEL}},
        sampling_params_column="sampling_params",
        use_tqdm=False,
    ).to_pylist()
    for i in (0, 1, 2, 3):
        _check_row(out[i], PER_ROW[i]["structured_outputs"])  # type: ignore[arg-type]
    _check_row(out[4], None)
    _check_row(out[5], None)
    for i, reason in ((6, "Invalid type: strnig"), (7, "exactly one of"), (8, "not valid JSON")):
        assert out[i]["finish_reason"] == "error" and out[i]["error"]["code"] == "bad_structured_output", out[i]
        assert reason in out[i]["error"]["message"]
    assert out[9]["finish_reason"] == "length" and out[9]["usage"]["completion_tokens"] == 2


def test_generate_refuses_a_bad_call_level_schema(model: Path) -> None:
    with pytest.raises(StructuredOutputError, match="regex"):
        generate(pa.table({"prompt": ["x"]}), model=str(model), sampling={"structured_outputs": {"regex": "(unclosed"}}, use_tqdm=False)


def _job(tmp_path: Path, model: Path, structured: dict[str, object], *, per_row: bool) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    columns = {"prompt": [f"Review {i}: buy now!" for i in range(len(PER_ROW))], "id": list(range(len(PER_ROW)))}
    if per_row:
        columns["sampling_params"] = pa.array(PER_ROW, SAMPLING_TYPE)  # type: ignore[assignment]
    pq.write_table(pa.table(columns), data / "part-000.parquet")
    sampling = {"max_tokens": 40, "temperature": 0.8, "structured_outputs": structured}
    job = {
        "model": str(model),
        "input": {"path": "data", "columns": {"id": "id", "prompt": "prompt", **({"sampling_params": "sampling_params"} if per_row else {})}},
        "output": {"path": "out"},
        "sampling": sampling,
        "engine": {"max_num_seqs": 4},
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))  # JSON is YAML
    return path


def test_job_counts_in_summary_and_report(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = _job(tmp_path, model, {"json": LABEL}, per_row=True)
    assert main(["run", str(job), "--quiet"]) == 0
    table = capsys.readouterr().out
    rows = pq.read_table(tmp_path / "out" / "part-000.parquet").to_pylist()
    ok = [r for r in rows if r["finish_reason"] != "error"]
    assert len(ok) == 7 and sum(r["error"] is not None for r in rows) == 3
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    counts = summary["structured_outputs"]
    completed = sum(r["finish_reason"] == "stop" for r in ok)
    assert counts == {"constrained": 7, "completed": completed, "cut_by_length": 7 - completed}
    assert counts["cut_by_length"] >= 1  # the max_tokens 2 row
    assert summary["rows"]["error_codes"] == {"bad_structured_output": 3}
    assert f"structured output rows      7 ({completed} completed their grammar, {7 - completed} cut by length)" in table
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["fingerprint"]["job"]["sampling"]["structured_outputs"] == {"json": LABEL}
    assert main(["report", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "completed their grammar" in page and "cut by length" in page


@pytest.mark.parametrize(
    ("structured", "message"),
    [
        ({"json": {"type": "array", "uniqueItems": True}}, "sampling.structured_outputs: structured_outputs.json: Unimplemented keys"),
        ({"regex": "a", "choice": ["a"]}, "sampling.structured_outputs: StructuredOutputsParams must set exactly one"),
        ({"jsonschema": {}}, "sampling.structured_outputs: unknown structured_outputs key"),
    ],
)
def test_a_bad_job_level_setting_exits_2_naming_the_key(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str], structured: dict[str, object], message: str
) -> None:
    job = _job(tmp_path, model, structured, per_row=False)
    assert main(["run", str(job), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(job) in err
    assert not (tmp_path / "out" / "part-000.parquet").exists()
