"""`batchgen.ray.worker.ShardWorker` without Ray: a worker whose model differs from the driver's
refuses to start (InputError naming its host and the differing fingerprint keys) and so never
writes output stamped with the driver's fingerprint; with the driver's model it starts and runs
a shard. Issue 20, defect 7."""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from batchgen.io import InputError
from batchgen.job.config_file import load_job_config
from batchgen.job.run import planned_job
from batchgen.job.setup import load_model
from batchgen.ray.worker import ShardWorker, fingerprint_changes
from tests.job.helpers import write_job
from tests.job.test_job_safety import job_data, write_shard
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tiny")
    driver = make_tiny_hf_folder(folder, num_heads=4, num_kv_heads=2, hidden_size=64, seed=0)
    other = make_tiny_hf_folder(folder, num_heads=4, num_kv_heads=2, hidden_size=64, seed=1)
    return driver, other


def test_a_worker_with_another_model_refuses_to_start(tmp_path: Path, models: tuple[Path, Path]) -> None:
    driver_model, other_model = models
    write_shard(tmp_path / "in" / "part-0.parquet", 0, 4)
    config = load_job_config(write_job(tmp_path / "job.yaml", job_data(driver_model)))
    with planned_job(config) as plan:
        # The same job file, but this node's copy of the model folder holds other weights.
        worker_config = dataclasses.replace(config, model=str(other_model))
        worker = ShardWorker(
            worker_config, str(plan.out_dir), plan.manifest.job_time, plan.fingerprint, plan.identities
        )
        with pytest.raises(InputError) as info:
            worker.start()
        other_fingerprint = load_model(worker_config).fingerprint
        message = str(info.value)
        assert message.startswith(f"{config.source}: the Ray worker on host {socket.gethostname()} (pid ")
        assert (
            f"  model.fingerprint: {plan.checkpoint.fingerprint!r} -> {other_fingerprint!r}\n" in message
        ), message
        assert message.count(" -> ") == 1, message  # the tokenizer and the job fields agree
        with pytest.raises(Exception, match="before it started"):
            worker.run_shard(plan.todo[0])
    assert list((tmp_path / "out").glob("*.parquet")) == []

    # With the driver's model the same worker starts and commits the shard.
    with planned_job(config) as plan:
        worker = ShardWorker(config, str(plan.out_dir), plan.manifest.job_time, plan.fingerprint, plan.identities)
        identity = worker.start()
        assert (identity.host, identity.pid) == (socket.gethostname(), os.getpid())
        result = worker.run_shard(plan.todo[0])
        assert result.record is not None and result.record.num_output_rows == 4
    assert pq.read_table(tmp_path / "out" / "part-0.parquet").num_rows == 4


def test_fingerprint_changes_name_every_differing_leaf() -> None:
    want = {"batchgen_version": "1.0", "job": {"seed": 1, "sampling": {"n": 1}}, "model": {"fingerprint": "a"}}
    got = {"batchgen_version": "1.1", "job": {"seed": 1, "sampling": {"n": 2}}, "extra": 3}
    assert fingerprint_changes(want, got) == [
        "batchgen_version: '1.0' -> '1.1'",
        "job.sampling.n: 1 -> 2",
        "model: {'fingerprint': 'a'} -> '<missing>'",
        "extra: '<missing>' -> 3",
    ]
    assert fingerprint_changes(want, want) == []
