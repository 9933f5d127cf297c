"""A full-batch CPU decode step as two streams (batchgen.engine.cpu_streams): each half on its own
thread with one OpenMP thread, the same greedy tokens as one stream."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.cpu_streams import TwoStreams
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.kernels import OpenMPThreads
from batchgen.models.checkpoint import load_checkpoint
from tests.tiny_models import make_tiny_hf_folder

pytestmark = pytest.mark.skipif(not OpenMPThreads().available, reason="torch without GNU OpenMP here")


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("two_threads")
def test_each_stream_runs_on_its_own_thread_with_one_openmp_thread() -> None:
    streams = TwoStreams()
    assert streams.usable

    def where() -> tuple[int, int]:
        return threading.get_ident(), torch.get_num_threads()

    first, second = streams.run(where, where)
    assert first == (threading.get_ident(), 1)
    assert second[0] != threading.get_ident() and second[1] == 1
    assert torch.get_num_threads() == 2  # the calling thread's count is back
    streams.close()


@pytest.mark.usefixtures("two_threads")
def test_an_error_on_either_side_is_raised_after_both_ran() -> None:
    streams = TwoStreams()
    finished = threading.Event()

    def fails() -> None:
        raise KeyError("first")

    def slow() -> int:
        finished.wait(0.2)
        finished.set()
        return 1

    with pytest.raises(KeyError, match="first"):
        streams.run(fails, slow)
    assert finished.is_set()  # run waited for the second before raising
    with pytest.raises(ValueError, match="second"):
        streams.run(lambda: 0, lambda: (_ for _ in ()).throw(ValueError("second")))
    assert torch.get_num_threads() == 2
    assert streams.run(lambda: "a", lambda: "b") == ("a", "b")  # still serving
    streams.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("streams"), num_layers=2, hidden_size=64, seed=5)


def _greedy_run(folder: Path, split_min_rows: int) -> tuple[list[tuple[int, ...]], int]:
    engine = LLMEngine(
        load_checkpoint(folder),
        scheduler_config=SchedulerConfig(max_num_seqs=16),
        cache_config=CacheConfig(),
        runner_config=RunnerConfig(device="cpu"),
    )
    engine.runner.split_min_rows = split_min_rows
    prompts = [[5 + i, 6, 7 + 2 * i, 8, 9][: 2 + i % 4] + [11] * (i % 7) for i in range(12)]
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=10 + i, ignore_eos=True)) for i, p in enumerate(prompts)]
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step()})
    return [outs[i].outputs[0].token_ids for i in ids], engine.runner.num_split_steps


@pytest.mark.usefixtures("two_threads")
def test_split_decode_steps_give_the_same_tokens(folder: Path) -> None:
    one_stream, num_split = _greedy_run(folder, split_min_rows=10**9)
    assert num_split == 0
    two_streams, num_split = _greedy_run(folder, split_min_rows=2)
    assert num_split > 5  # the decode steps ran split (the prompts' steps never do)
    assert two_streams == one_stream
    assert len({t for row in one_stream for t in row}) > 3  # not one token repeated: a real comparison


def test_one_torch_thread_never_splits(folder: Path) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, num_split = _greedy_run(folder, split_min_rows=2)
    finally:
        torch.set_num_threads(before)
    assert num_split == 0
