"""A per-row seed beyond 64 bits (a uint64 `sampling_params.seed` column) is an error row, not a
job that dies writing its output's int64 `seed` column (issue 20: the class of values Arrow
cannot store)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.cli.main import main
from batchgen.engine.sampling_params import SamplingParams
from tests.job.helpers import write_job
from tests.tiny_models import make_tiny_hf_folder


@pytest.mark.parametrize("seed", [2**63, 2**64 - 1, -(2**63) - 1, 10**30])
def test_a_seed_beyond_64_bits_is_refused(seed: int) -> None:
    with pytest.raises(ValueError, match="64-bit integer"):
        SamplingParams(seed=seed)


def test_the_64_bit_range_is_accepted() -> None:
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


def test_a_uint64_seed_column_gives_an_error_row_and_the_job_finishes(tmp_path: Path) -> None:
    model = make_tiny_hf_folder(tmp_path / "tiny", num_heads=4, num_kv_heads=2, hidden_size=64)
    sp = pa.array([{"seed": 3}, {"seed": 2**63 + 5}], pa.struct([("seed", pa.uint64())]))
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["Hello", "World"], "sp": sp}), tmp_path / "in" / "a.parquet")
    job = write_job(
        tmp_path / "job.yaml",
        {
            "model": str(model),
            "input": {"path": "in", "columns": {"sampling_params": "sp"}},
            "output": {"path": "out"},
            "sampling": {"max_tokens": 2},
            "engine": {"device": "cpu", "max_model_len": 64},
            "max_error_rate": 1.0,
        },
    )
    assert main(["run", str(job), "--quiet"]) == 0
    rows = pq.read_table(tmp_path / "out" / "a.parquet").to_pylist()
    assert rows[0]["error"] is None and rows[0]["output"]
    assert rows[1]["error"]["code"] == "invalid_sampling_params"
    assert "64-bit" in rows[1]["error"]["message"]
