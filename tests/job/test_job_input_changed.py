"""An input shard replaced after the job was planned and before it is read (issue 20, defect 6):
before the fix its new rows were written stamped with the planned identity, which a resume then
accepted. Now the read takes the identity from the file it reads and refuses the mismatch: the
run stops (exit 2) without committing that shard, and a rerun generates it from the new data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from batchgen.job import files
from batchgen.job.stages import ShardMeta
from tests.job.test_job_safety import good_job, run, write_shard
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def test_a_shard_replaced_between_planning_and_reading_is_not_written(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = good_job(tmp_path, model_dir)
    target = tmp_path / "in" / "part-1.parquet"
    real = files.FileSource.iter_batches

    def replace_then_read(self: files.FileSource, shard: ShardMeta) -> Any:
        if shard.name == "part-1.parquet":
            # the same row count, other ids and prompts: the footer says 5 rows either way
            os.replace(write_shard(tmp_path / "new.parquet", 500, 5, word="Other"), target)
        return real(self, shard)

    monkeypatch.setattr(files.FileSource, "iter_batches", replace_then_read)
    rc, _, err = run(job, capsys)
    assert rc == 2 and "part-1.parquet: the input shard changed after the job was planned" in err, err
    out = tmp_path / "out"
    assert not (out / "part-1.parquet").exists()
    monkeypatch.setattr(files.FileSource, "iter_batches", real)
    rc, _, err = run(job, capsys)  # the rerun plans with the new file
    assert rc == 0, err
    assert pq.read_table(out / "part-1.parquet").column("id").to_pylist() == list(range(500, 505))
