"""`batchgen.ray.Generate` in a Ray Data pipeline gives what `batchgen.generate` gives.

A 3-block dataset (one row with a null prompt: a per-row error, not a failed batch), seeded
sampling with n=2 and an id column, so every value must match: outputs, seeds, errors, usage
(except `usage.cached_tokens`: each engine has its own prefix cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from batchgen import generate
from tests.tiny_models import make_tiny_hf_folder

pytest.importorskip("ray")
pytestmark = pytest.mark.ray


def _table() -> pa.Table:
    prompts: list[str | None] = [
        f"You are a careful assistant. Question {i}: name a river in country {i % 4}." for i in range(18)
    ]
    prompts[7] = None
    return pa.table(
        {
            "id": pa.array([100 + i for i in range(18)], pa.int64()),
            "prompt": pa.array(prompts, pa.string()),
            "topic": pa.array([f"t{i % 3}" for i in range(18)], pa.string()),
        }
    )


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("id", "ascending"), ("sample_index", "ascending")])


def test_generate_stage_over_three_blocks_equals_generate(ray_runtime: Any, tmp_path: Path) -> None:
    import ray

    from batchgen.ray import Generate

    model = make_tiny_hf_folder(tmp_path / "tiny", num_heads=4, num_kv_heads=2, hidden_size=64)
    kwargs = {
        "model": str(model),
        "sampling": {"max_tokens": 5, "temperature": 0.8, "n": 2},
        "id_column": "id",
        "seed": 7,
        "device": "cpu",
        "max_num_seqs": 4,
    }
    table = _table()
    want = generate(table, use_tqdm=False, **kwargs)

    ds = ray.data.from_arrow([table.slice(0, 6), table.slice(6, 6), table.slice(12)])
    assert ds.materialize().num_blocks() == 3
    out = ds.map_batches(
        Generate,
        fn_constructor_kwargs=kwargs,
        batch_size=None,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=0.5,
    )
    got = _sorted(pa.concat_tables(ray.get(out.to_arrow_refs())))
    want = _sorted(want)
    assert got.num_rows == want.num_rows == 36
    assert got.schema.equals(want.schema), f"{got.schema}\nexpected\n{want.schema}"
    usage = ["prompt_tokens", "completion_tokens"]
    assert got.drop_columns(["usage"]).equals(want.drop_columns(["usage"]))
    for name in usage:
        assert got.column("usage").combine_chunks().field(name) == want.column("usage").combine_chunks().field(name)
    errors = [e for e in got.column("error").to_pylist() if e is not None]
    assert [e["code"] for e in errors] == ["invalid_prompt", "invalid_prompt"]
