"""A job keeps one copy of the weights while it runs: the engine's (issue 25).

The loaded checkpoint's plain float32 weights are what the engine is built from; on the CPU it
fuses and packs its own copies, so a plan that kept the checkpoint whole kept a second copy of
the model (0.4 GB of the built-in one) resident for the whole run.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchgen.job.run as run_module
from batchgen.job.config import JobConfig
from batchgen.job.config_file import load_job_config
from batchgen.models.checkpoint import Checkpoint
from tests.job.helpers import write_job
from tests.tiny_models import make_tiny_hf_folder

NUM_LAYERS = 2
# Taken into fused tensors (qkv, gate_up) by the engine: only the checkpoint could keep these.
FUSED = tuple(
    f"model.layers.{i}.{name}.weight"
    for i in range(NUM_LAYERS)
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
)


def test_a_running_job_holds_no_plain_weights_beside_the_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_tiny_hf_folder(tmp_path / "tiny", num_layers=NUM_LAYERS, num_heads=4, num_kv_heads=2, hidden_size=64)
    (tmp_path / "in").mkdir()
    prompts = [f"Question {i}: name a river." for i in range(6)]
    pq.write_table(pa.table({"id": pa.array(range(6), pa.int64()), "prompt": prompts}), tmp_path / "in" / "part-0.parquet")
    job = write_job(
        tmp_path / "job.yaml",
        {
            "model": str(model),
            "input": {"path": "in"},
            "output": {"path": "out"},
            "sampling": {"max_tokens": 3, "temperature": 0.0},
            "engine": {"device": "cpu", "max_num_seqs": 4},
        },
    )
    weights: dict[str, weakref.ref[Any]] = {}
    alive_while_running: set[str] = set()
    real_load, real_pipeline = run_module.load_model, run_module.run_pipeline_sync

    def load_model(config: JobConfig) -> Checkpoint:
        checkpoint = real_load(config)
        weights.update({name: weakref.ref(tensor) for name, tensor in checkpoint.weights.items()})
        return checkpoint

    def run_pipeline_sync(*args: Any, **kwargs: Any) -> Any:
        gc.collect()
        alive_while_running.update(name for name, ref in weights.items() if ref() is not None)
        return real_pipeline(*args, **kwargs)

    monkeypatch.setattr(run_module, "load_model", load_model)
    monkeypatch.setattr(run_module, "run_pipeline_sync", run_pipeline_sync)
    summary = run_module.run_job(load_job_config(job), use_tqdm=False)
    assert summary.data["rows"]["by_status"] == {"ok": 6}
    assert set(FUSED) <= weights.keys()
    assert alive_while_running.isdisjoint(FUSED), sorted(alive_while_running & set(FUSED))
