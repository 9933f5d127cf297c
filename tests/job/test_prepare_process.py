"""Rows prepared in a child process (`batchgen.job.prepare_stage.PrepareProcess`, a simulation's
prepare stage): the same rows and id sets as in a thread, errors raised as themselves, a dead
child failing its futures instead of hanging, no re-import of the caller's script, the child's
niceness, and a whole simulation equal either way."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.engine.sampling_params import SamplingParams
from batchgen.io import ColumnMap
from batchgen.job.prepare import PreparedRow, RowPreparer
from batchgen.job.prepare_stage import PrepareItem, PrepareProcess, prepare_batch
from batchgen.job.stages import ShardMeta
from tests.tiny_models import smollm2_tokenizer

NOW = datetime(2026, 3, 4, 5, 6, 7)
COLUMNS = ColumnMap(id="id", prompt="prompt", passthrough=("tag",))
LONG = " ".join(f"w{i}" for i in range(80))


class _Refusing(RowPreparer):
    """Raises on a batch holding the prompt "boom" (row problems never raise: they are rows)."""

    def prepare(self, *args: Any, **kwargs: Any) -> list[PreparedRow]:
        if "boom" in (args[3] or ()):
            raise ValueError("refused a batch with boom in it")
        return super().prepare(*args, **kwargs)


def _preparer(kind: type[RowPreparer] = RowPreparer) -> RowPreparer:
    return kind(
        smollm2_tokenizer(), SamplingParams(max_tokens=8), max_model_len=48,
        prompt_too_long="truncate_left", job_seed=3, now=NOW,
    )


def _item(shard: int, first: int, ids: list[int], prompts: list[str | None], num_rows: int) -> PrepareItem:
    batch = pa.record_batch({
        "id": pa.array(ids, pa.int64()),
        "prompt": pa.array(prompts, pa.string()),
        "tag": pa.array([f"t{i}" for i in ids], pa.string()),
    })
    meta = ShardMeta(shard, f"part-{shard}", num_rows, f"part-{shard}.parquet", pa.int64(), pa.schema([("tag", pa.string())]))
    return PrepareItem(meta, first, batch)


# Shard 0 in two batches (a duplicate id inside it, a null prompt, a prompt cut by the length
# policy, one too long even when cut); shard 1 repeats two of shard 0's ids (kept, counted).
ITEMS = [
    _item(0, 0, [1, 2, 3], ["Hello there.", None, LONG], 5),
    _item(0, 3, [2, 4], ["again", "What is a radix tree?"], 5),
    _item(1, 0, [1, 4, 9], ["one", "four", "nine"], 3),
]


def _in_thread(preparer: RowPreparer, items: list[PrepareItem]) -> list[list[PreparedRow]]:
    out = []
    for item in items:
        out.append(prepare_batch(preparer, COLUMNS, item))
        if item.ends_shard:
            preparer.forget_shard(item.shard.index)
    return out


def test_a_child_prepares_the_rows_and_ends_with_the_id_sets_a_thread_would() -> None:
    here, there = _preparer(), _preparer()
    expected = _in_thread(here, ITEMS)
    with PrepareProcess([there], COLUMNS) as process:
        futures = [process.submit(0, item) for item in ITEMS]
        got = [f.result(timeout=60) for f in futures]
        assert there.num_duplicate_ids_across_shards == 0  # the parent's copy waits for close
    assert got == expected
    codes = [r.error.code if r.error else None for rows in got for r in rows]
    assert codes.count("duplicate_id") == 1 and None in codes and len(set(codes)) >= 3
    assert here.num_duplicate_ids_across_shards == there.num_duplicate_ids_across_shards == 2
    assert here.id_state() == there.id_state()
    # the parent's preparer carries on from the child's sets: shard 2 repeats id 9 of shard 1
    more = _item(2, 0, [9, 10], ["x", "y"], 2)
    assert _in_thread(here, [more]) == _in_thread(there, [more])
    assert there.num_duplicate_ids_across_shards == 3


def test_each_preparer_of_a_process_keeps_its_own_ids() -> None:
    first, second = _preparer(), _preparer()
    with PrepareProcess([first, second], COLUMNS) as process:
        process.submit(0, ITEMS[0]).result(timeout=60)
        process.submit(1, ITEMS[2]).result(timeout=60)
        with pytest.raises(IndexError):
            process.submit(2, ITEMS[0])
    assert first.num_duplicate_ids_across_shards == second.num_duplicate_ids_across_shards == 0
    assert first.id_state().seen_ids == {0: {1, 2, 3}} and second.id_state().seen_ids == {}


def test_an_error_in_the_child_is_raised_as_itself_and_the_child_goes_on() -> None:
    bad = _item(0, 0, [1, 2], ["fine", "boom"], 2)
    with pytest.raises(ValueError, match="refused a batch"):
        prepare_batch(_preparer(_Refusing), COLUMNS, bad)
    with PrepareProcess([_preparer(_Refusing)], COLUMNS) as process:
        failed, after = process.submit(0, bad), process.submit(0, ITEMS[2])
        with pytest.raises(ValueError, match="refused a batch with boom in it"):
            failed.result(timeout=60)
        assert [r.id for r in after.result(timeout=60)] == [1, 4, 9]


def test_a_dead_child_fails_the_waiting_futures_and_close() -> None:
    process = PrepareProcess([_preparer()], COLUMNS)
    process.submit(0, ITEMS[2]).result(timeout=60)
    os.kill(process.pid, signal.SIGKILL)
    with pytest.raises(ChildProcessError, match="ended"):
        process.submit(0, ITEMS[0]).result(timeout=60)
    with pytest.raises(ChildProcessError):
        process.close()
    with pytest.raises(RuntimeError, match="closed"):
        process.submit(0, ITEMS[0])


def test_leaving_on_an_exception_ends_the_child_without_waiting_for_its_queue() -> None:
    with pytest.raises(KeyError), PrepareProcess([_preparer()], COLUMNS) as process:
        futures = [process.submit(0, ITEMS[0]) for _ in range(20)]
        pid = process.pid
        raise KeyError("stop")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    for future in futures:  # every one settled: rows, or the child's end
        assert future.done()


def test_a_script_without_a_main_guard_is_not_imported_again(tmp_path: Path) -> None:
    """A multiprocessing child imports the caller's main script; under spawn, a script without
    `if __name__ == "__main__"` then started a child of its own and the parent hung."""
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent("""
        from tests.job.test_prepare_process import COLUMNS, ITEMS, _preparer
        from batchgen.job.prepare_stage import PrepareProcess
        print("script body ran", flush=True)
        with PrepareProcess([_preparer()], COLUMNS) as process:
            rows = process.submit(0, ITEMS[2]).result(timeout=60)
        print("ids", [r.id for r in rows], flush=True)
    """))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(root)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["script body ran", "ids [1, 4, 9]"]


def test_the_childs_module_imports_no_torch() -> None:
    """The child starts in about half a second because nothing it imports pulls in torch."""
    code = "import sys, batchgen.job.prepare_stage; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_child_runs_at_the_niceness_asked_and_a_simulation_asks_ten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    for niceness in (0, 7):
        with PrepareProcess([_preparer()], COLUMNS, niceness=niceness) as process:
            process.submit(0, ITEMS[2]).result(timeout=60)  # started: the niceness is set before
            assert os.getpriority(os.PRIO_PROCESS, process.pid) == min(19, mine + niceness)
    with pytest.raises(ValueError, match="niceness"):
        PrepareProcess([_preparer()], COLUMNS, niceness=20)
    import batchgen.sim.job as sim_job

    asked = []

    class Recording(PrepareProcess):
        def __init__(self, *args: Any, niceness: int = 0) -> None:
            asked.append(niceness)
            super().__init__(*args, niceness=niceness)

    monkeypatch.setattr(sim_job, "PrepareProcess", Recording)
    simulate = _small_simulation(tmp_path)
    simulate(None, True)
    assert asked == [sim_job.PREPARE_NICENESS] == [10]


def _small_simulation(tmp_path: Path) -> Any:
    """`simulate(workers, prepare_in_process)` of a small job (3 shards of 40 rows, the third
    repeating the first's ids)."""
    from batchgen.cli.simulate import _token_source
    from batchgen.job.config_file import load_job_config
    from batchgen.sim.engine import load_sim_model
    from batchgen.sim.hardware import load_hardware
    from batchgen.sim.job import simulate_job
    from tests.job.helpers import make_prompt_shards, write_job

    make_prompt_shards(tmp_path / "data", num_shards=3, rows_per_shard=40)
    # shard 2 repeats shard 0's ids: counted across shards in both ways of preparing
    pq.write_table(pq.read_table(tmp_path / "data" / "part-0.parquet"), tmp_path / "data" / "part-2.parquet")
    path = write_job(tmp_path / "job.yaml", {
        "model": None,
        "input": {"path": "data", "columns": {"id": "id", "prompt": "prompt"}, "batch_rows": 16},
        "output": {"path": "out"},
        "sampling": {"max_tokens": 24, "temperature": 0.0},
        "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 256},
    })
    config = load_job_config(path, [])
    model = load_sim_model(None)
    tokens, source = _token_source(argparse.Namespace(outputs_from=None, output_lens=None), config, model)

    def simulate(workers: int | None, in_process: bool) -> Any:
        return simulate_job(
            config, model=model, hardware=load_hardware("h100-sxm"), tokens=tokens, token_source=source,
            workers=workers, use_tqdm=False, prepare_in_process=in_process,
        )

    return simulate


def test_a_simulation_is_the_same_with_rows_prepared_in_a_process_or_a_thread(tmp_path: Path) -> None:
    simulate = _small_simulation(tmp_path)
    results = {}
    for workers in (None, 2):
        for in_process in (True, False):
            results[workers, in_process] = simulate(workers, in_process)
    for workers in (None, 2):
        a, b = results[workers, True], results[workers, False]
        assert a.summary["rows"] == b.summary["rows"] and a.summary["tokens"] == b.summary["tokens"]
        drop = {"simulation_s", "rows_per_s_simulated"}
        assert {k: v for k, v in a.summary["simulated"].items() if k not in drop} == {
            k: v for k, v in b.summary["simulated"].items() if k not in drop
        }
        # the same steps; times relative to the simulation's start (its wall-clock origin differs)
        for name in a.timeline.column_names:
            x, y = a.timeline.column(name).to_pylist(), b.timeline.column(name).to_pylist()
            if name in ("t_start", "t_end"):
                x, y = [v - x[0] for v in x], [v - y[0] for v in y]
                assert x == pytest.approx(y, abs=1e-6), name
            elif name != "run_id":
                assert x == y, name
    assert results[None, True].summary["rows"]["duplicate_ids_across_shards"] == 40
