"""`batchgen.generate` over a pyarrow.Table and a polars DataFrame: n samples per row, input
order, the input columns kept and the output columns appended, and the same outputs as
`batchgen run` on the same rows (row ids = positions, as `generate` numbers them)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchgen
from batchgen.cli.main import main
from batchgen.io import OUTPUT_COLUMNS
from tests.job.helpers import write_job
from tests.tiny_models import make_tiny_hf_folder

N = 2
ENGINE = {"device": "cpu", "max_model_len": 128, "max_num_seqs": 4}
SAMPLING = {"max_tokens": 5, "temperature": 0.8, "n": N}
PROMPTS = [f"Tell me about item {i} and {'rivers' if i % 2 else 'hills'}" for i in range(7)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(
        tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64
    )


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return pa.table(
        {
            "topic": pa.array([f"t{i % 3}" for i in range(len(PROMPTS))]),
            "prompt": pa.array(PROMPTS),
            "weight": pa.array([i / 4 for i in range(len(PROMPTS))], pa.float64()),
        }
    )


@pytest.fixture(scope="module")
def job_output(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, table: pa.Table) -> pa.Table:
    """`batchgen run` over the same rows, ids 0..n-1."""
    folder = tmp_path_factory.mktemp("job")
    (folder / "in").mkdir()
    ids = pa.array(range(table.num_rows), pa.int64())
    pq.write_table(table.append_column("id", ids), folder / "in" / "part-0.parquet")
    write_job(
        folder / "job.yaml",
        {
            "model": str(model_dir),
            "input": {"path": "in", "columns": {"passthrough": ["topic", "weight"]}},
            "output": {"path": "out"},
            "sampling": SAMPLING,
            "engine": ENGINE,
        },
    )
    assert main(["run", str(folder / "job.yaml"), "--quiet"]) == 0
    return pq.read_table(folder / "out" / "part-0.parquet")


def _check(result: pa.Table, table: pa.Table, job_output: pa.Table) -> None:
    output_columns = [c for c in OUTPUT_COLUMNS if c in result.column_names]
    # the input columns first, in their order, then the output columns
    assert result.column_names == [*table.column_names, *output_columns]
    assert "id" not in result.column_names
    assert result.num_rows == N * table.num_rows
    # each input row N times, in input order, its values carried along
    for name in table.column_names:
        assert result.column(name).to_pylist() == [v for v in table.column(name).to_pylist() for _ in range(N)]
    assert result.column("sample_index").to_pylist() == list(range(N)) * table.num_rows
    # the same generations as `batchgen run` on these rows
    for name in ("output", "finish_reason", "stop_reason", "error", "seed", "sample_index"):
        assert result.column(name).to_pylist() == job_output.column(name).to_pylist(), name
    for key in ("prompt_tokens", "completion_tokens"):
        got = [u[key] for u in result.column("usage").to_pylist()]
        assert got == [u[key] for u in job_output.column("usage").to_pylist()], key
    assert all(o for o in result.column("output").to_pylist())


def test_generate_over_a_pyarrow_table(
    model_dir: Path, table: pa.Table, job_output: pa.Table
) -> None:
    result = batchgen.generate(table, model=str(model_dir), sampling=SAMPLING, use_tqdm=False, **ENGINE)
    assert isinstance(result, pa.Table)
    _check(result, table, job_output)


def test_generate_over_a_polars_dataframe(
    model_dir: Path, table: pa.Table, job_output: pa.Table
) -> None:
    pl = pytest.importorskip("polars")
    frame = pl.from_arrow(table)
    result = batchgen.generate(frame, model=str(model_dir), sampling=SAMPLING, use_tqdm=False, **ENGINE)
    assert isinstance(result, pl.DataFrame)
    _check(result.to_arrow(), table, job_output)
