"""While a pipeline runs, Python's collector looks at young objects every 50,000 allocations
instead of 700, with the objects alive at its start frozen out of full collections; both are put
back when the last pipeline of the process ends (`batchgen.job.pipeline._fewer_collections`).
A simulation spent 15% of its time collecting before (`gc.callbacks` timing on 20,000 rows)."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import pyarrow as pa
import pytest

import batchgen
from batchgen.engine.llm_engine import LLMEngine
from batchgen.job.pipeline import _YOUNG_COLLECTION_THRESHOLD, _fewer_collections
from tests.tiny_models import make_tiny_hf_folder


def test_thresholds_are_raised_inside_and_restored_after_the_last_user() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with _fewer_collections():
        assert gc.get_threshold() == (_YOUNG_COLLECTION_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > frozen
        with _fewer_collections():  # a second pipeline in the process
            assert gc.get_threshold()[0] == _YOUNG_COLLECTION_THRESHOLD
        assert gc.get_threshold()[0] == _YOUNG_COLLECTION_THRESHOLD  # the first still runs
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_restored_when_the_pipeline_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), _fewer_collections():
        raise RuntimeError("a stage failed")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_objects_the_process_froze_stay_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with _fewer_collections():
            assert gc.get_threshold()[0] == _YOUNG_COLLECTION_THRESHOLD
        assert gc.get_freeze_count() > frozen // 2  # still frozen (a frozen object may have been freed)
    finally:
        gc.unfreeze()


def test_an_engine_steps_with_the_raised_threshold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_tiny_hf_folder(tmp_path / "model", num_heads=4, num_kv_heads=2, hidden_size=64)
    seen: list[int] = []
    real_step = LLMEngine.step

    def step(self: LLMEngine) -> object:
        seen.append(gc.get_threshold()[0])
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", step)
    before = gc.get_threshold()
    table = pa.table({"prompt": [f"Item {i}" for i in range(8)]})
    batchgen.generate(table, model=str(model), sampling={"max_tokens": 3, "temperature": 0.0}, use_tqdm=False,
                      device="cpu", max_model_len=64)
    assert seen and set(seen) == {_YOUNG_COLLECTION_THRESHOLD}
    assert gc.get_threshold() == before


def test_pipelines_on_two_threads_restore_once_both_end() -> None:
    before = gc.get_threshold()
    inside = threading.Event()
    leave = threading.Event()

    def other() -> None:
        with _fewer_collections():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    with _fewer_collections():
        pass
    assert gc.get_threshold()[0] == _YOUNG_COLLECTION_THRESHOLD  # the other pipeline still runs
    leave.set()
    t.join(10)
    assert gc.get_threshold() == before
