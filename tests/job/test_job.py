"""`batchgen run` end to end on a tiny random model: shards in, shards out, schema, order, resume."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.cli.main import main
from batchgen.io import output_schema
from tests.tiny_models import make_tiny_hf_folder

NUM_SHARDS = 3


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def write_shards(folder: Path, rows_per_shard: list[int]) -> list[pa.Table]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    tables = []
    next_id = 0
    for s, n in enumerate(rows_per_shard):
        ids = list(range(next_id, next_id + n))
        rng.shuffle(ids)  # ids need not be sorted: order is the file's
        next_id += n
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "prompt": pa.array([f"Question {rng.randrange(3)} about topic {i % 4}: what is {i}?" for i in ids], pa.string()),
                "topic": pa.array([f"t{i % 4}" for i in ids], pa.string()),
                "weight": pa.array([float(i) / 7 for i in ids], pa.float32()),
            }
        )
        pq.write_table(table, folder / f"part-{s:03d}.parquet", row_group_size=7)
        tables.append(table)
    return tables


def write_job(path: Path, model: Path, **extra: str) -> Path:
    lines = [
        f"model: {model}",
        "input:",
        "  path: data",
        "  columns: {id: id, prompt: prompt, passthrough: [topic, weight]}",
        "  batch_rows: 5",
        "output:",
        "  path: out",
        "  include_token_ids: true",
        "sampling: {max_tokens: 5, temperature: 0.7, n: 2}",
        "engine: {max_num_seqs: 8, max_num_batched_tokens: 64}",
    ]
    extra.setdefault("window_rows", "16")
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_outputs(out: Path) -> dict[str, pa.Table]:
    # timeline.parquet sits beside the shards; it is the run's record, not an output shard.
    return {p.name: pq.read_table(p) for p in sorted(out.glob("part-*.parquet"))}


def test_shards_in_shards_out(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = write_shards(tmp_path / "data", [13, 0, 21])
    job = write_job(tmp_path / "job.yaml", model)
    assert main(["run", str(job), "--quiet"]) == 0
    summary_text = capsys.readouterr().out
    assert "prefix hit rate" in summary_text and "output tokens/s" in summary_text

    outputs = read_outputs(tmp_path / "out")
    assert sorted(outputs) == ["part-000.parquet", "part-001.parquet", "part-002.parquet"]
    expected_schema = output_schema(
        pa.int64(),
        pa.schema([pa.field("topic", pa.string()), pa.field("weight", pa.float32())]),
        with_token_ids=True,
        with_logprobs=False,
    )
    for table, name in zip(inputs, sorted(outputs), strict=True):
        out = outputs[name]
        assert out.schema.equals(expected_schema), name
        # every input row once per sample, in input order, passthrough values carried along
        ids = table.column("id").to_pylist()
        assert out.column("id").to_pylist() == [i for i in ids for _ in range(2)]
        assert out.column("sample_index").to_pylist() == [0, 1] * len(ids)
        assert out.column("topic").to_pylist() == [t for t in table.column("topic").to_pylist() for _ in range(2)]
        assert out.column("weight").to_pylist() == [w for w in table.column("weight").to_pylist() for _ in range(2)]
        for row in out.to_pylist():
            assert row["finish_reason"] in ("stop", "length") and row["error"] is None
            assert row["usage"]["completion_tokens"] == len(row["output_token_ids"]) <= 5
            assert row["usage"]["prompt_tokens"] > 0
        # the two samples of a row use different seeds
        seeds = out.column("seed").to_pylist()
        assert all(seeds[i] != seeds[i + 1] for i in range(0, len(seeds), 2))

    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rows"]["total"] == 34 and summary["rows"]["by_status"] == {"ok": 34}
    assert summary["rows"]["output_rows"] == 68
    assert summary["shards"] == {"committed_this_run": 3, "skipped": 0}
    assert summary["tokens"]["output"] == sum(
        r["usage"]["completion_tokens"] for t in outputs.values() for r in t.to_pylist()
    )
    # the manifest lists every shard with the figures its output file holds
    assert manifest["format"] == 2
    assert sorted(manifest["shards"]) == sorted(outputs)
    for name, table in outputs.items():
        record = manifest["shards"][name]
        rows = table.to_pylist()
        assert record["input_path"] == str(tmp_path / "data" / name)
        assert record["num_input_rows"] == table.num_rows // 2
        assert record["num_output_rows"] == table.num_rows
        assert record["rows_by_status"] == {"ok": len(rows), "error": 0}
        assert record["completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in rows)
        assert record["prompt_tokens"] == sum(r["usage"]["prompt_tokens"] for r in rows)

    # A second run skips every shard and leaves the files untouched.
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("part-*.parquet")}
    assert main(["run", str(job), "--quiet"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["shards"] == {"committed_this_run": 0, "skipped": 3}
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("part-*.parquet")} == mtimes


def test_outputs_do_not_depend_on_order_window_or_batching(tmp_path: Path, model: Path) -> None:
    write_shards(tmp_path / "data", [17, 9])
    results = []
    for i, extra in enumerate(
        [
            {"order": "prefix"},
            {"order": "input"},
            {"order": "prefix", "window_rows": "3"},
        ]
    ):
        job = write_job(tmp_path / f"job{i}.yaml", model, **extra)
        assert main(["run", str(job), "--quiet", "--set", f"output.path=out{i}"]) == 0
        results.append(read_outputs(tmp_path / f"out{i}"))
    assert results[0].keys() == results[1].keys() == results[2].keys()
    for name in results[0]:
        outputs = [_without_cached_tokens(r[name]) for r in results]
        assert outputs[0].equals(outputs[1])
        assert outputs[0].equals(outputs[2])


def _without_cached_tokens(table: pa.Table) -> pa.Table:
    """The table with usage.cached_tokens left out: how many prompt tokens the prefix cache
    served a row depends on which rows ran before it (in input order, the rows sharing a prefix
    are admitted in different steps and copy it; in prefix order, together, and compute it)."""
    usage = table.column("usage").combine_chunks()
    kept = [f.name for f in usage.type if f.name != "cached_tokens"]
    assert len(kept) == usage.type.num_fields - 1
    slim = pa.StructArray.from_arrays([usage.field(n) for n in kept], names=kept)
    return table.set_column(table.schema.get_field_index("usage"), "usage", slim)


def test_changed_configuration_is_refused_then_restart(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_shards(tmp_path / "data", [6])
    job = write_job(tmp_path / "job.yaml", model)
    assert main(["run", str(job), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", str(job), "--quiet", "--set", "sampling.max_tokens=2"]) == 2
    err = capsys.readouterr().err
    assert "max_tokens: 5 -> 2" in err and "--restart" in err and "Traceback" not in err
    # throughput knobs do not change outputs: a resume may change them
    assert main(["run", str(job), "--quiet", "--set", "engine.max_num_seqs=3", "--set", "window_rows=2"]) == 0
    assert main(["run", str(job), "--quiet", "--set", "sampling.max_tokens=2", "--restart"]) == 0
    out = read_outputs(tmp_path / "out")["part-000.parquet"]
    assert max(r["completion_tokens"] for r in out.column("usage").to_pylist()) <= 2
