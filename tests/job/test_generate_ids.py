"""`batchgen.generate(table, id_column=...)`: rows keyed by the table's ids, as in a job.

With an id column each row's seed derives from its id (so a Ray Data batch gives the same rows
wherever it starts), a duplicate id is an error row, and the input columns come back in place.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batchgen import generate
from batchgen.job.config_file import load_job_config
from batchgen.job.run import run_job
from tests.job.helpers import write_job
from tests.tiny_models import make_tiny_hf_folder

SAMPLING = {"max_tokens": 4, "temperature": 0.8, "n": 2}


def test_id_column_gives_a_jobs_seeds_and_outputs(tmp_path: Path) -> None:
    model = make_tiny_hf_folder(tmp_path / "tiny", num_heads=4, num_kv_heads=2, hidden_size=64)
    table = pa.table(
        {
            "id": pa.array([40, 7, 12, 7, 99], pa.int64()),
            "prompt": [f"Question {i}: name a river." for i in range(5)],
            "note": ["a", "b", "c", "d", "e"],
        }
    )
    (tmp_path / "in").mkdir()
    pq.write_table(table.select(["id", "prompt"]), tmp_path / "in" / "part-0.parquet")
    job = write_job(
        tmp_path / "job.yaml",
        {
            "model": str(model),
            "input": {"path": "in"},
            "output": {"path": "out"},
            "sampling": SAMPLING,
            "engine": {"device": "cpu", "max_num_seqs": 4},
            "seed": 7,
        },
    )
    run_job(load_job_config(job), use_tqdm=False)
    want = pq.read_table(tmp_path / "out" / "part-0.parquet")

    common = {"model": str(model), "sampling": SAMPLING, "seed": 7, "device": "cpu", "max_num_seqs": 4}
    got = generate(table, id_column="id", use_tqdm=False, **common)
    assert got.column_names[:3] == ["id", "prompt", "note"]
    assert got.column("note").to_pylist() == [n for n in "abcde" for _ in range(2)]
    for name in ("id", "sample_index", "output", "finish_reason", "seed", "error"):
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    codes = [e and e["code"] for e in got.column("error").to_pylist()]
    assert codes == [None, None, None, None, None, None, "duplicate_id", "duplicate_id", None, None]

    # A slice keeps its rows' seeds and outputs with ids; without them, positions decide.
    part = generate(table.slice(2), id_column="id", use_tqdm=False, **common)
    assert part.column("seed").to_pylist() == got.column("seed").to_pylist()[4:]
    by_position = generate(table.slice(2), use_tqdm=False, **common)
    assert by_position.column("seed").to_pylist() != part.column("seed").to_pylist()
