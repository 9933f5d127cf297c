"""Resident KV memory of a CPU engine follows the blocks in use, not the pool (issue 25).

A CPU pool is mapped lazily (`kernels.lazy_zeros`): a block's pages are committed when it is
first written. Over many short requests a pool of 4096 blocks is written only where blocks were
handed out, so what matters is which free block the engine takes: a block written before
(evicting cached content, least recently used first) rather than a never-used one. The resident
pages of each layer's K and V are read with mincore(2); each block is exactly one page of each.
"""

from __future__ import annotations

import ctypes
import mmap
import random
import sys
from pathlib import Path

import pytest
import torch

import batchgen.engine.llm_engine as llm_engine_module
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.models.checkpoint import load_checkpoint
from tests.tiny_models import make_tiny_hf_folder

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore of the pool's pages")

NUM_BLOCKS = 4096
BLOCK_SIZE = 16
NUM_REQUESTS = 96


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 32, two KV heads: one block of one layer's K (or V) is 2 * 32 * 16 * 4 = 4096 bytes
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=2, num_kv_heads=2, hidden_size=64)


def _resident_pages(tensor: torch.Tensor) -> int:
    """Pages of `tensor`'s buffer that are in memory (mincore(2) over its page-aligned mapping)."""
    storage = tensor.untyped_storage()
    address, nbytes = storage.data_ptr(), storage.nbytes()
    assert address % mmap.PAGESIZE == 0, "a lazily mapped pool starts on a page"
    num_pages = -(-nbytes // mmap.PAGESIZE)
    pages = (ctypes.c_ubyte * num_pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if libc.mincore(address, num_pages * mmap.PAGESIZE, pages) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(page & 1 for page in pages)


def _run_many_short_requests(folder: Path) -> tuple[LLMEngine, list[int]]:
    """96 prompts of 30 distinct tokens, 8 generated each (3 blocks a request), 4 at a time;
    returns the engine and the resident pages of each layer's K and V after the run."""
    engine = LLMEngine(
        load_checkpoint(str(folder)),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=NUM_BLOCKS),
        runner_config=RunnerConfig(device="cpu", max_model_len=256),
    )
    for k_cache, _ in engine.runner.kv_caches:
        assert k_cache.untyped_storage().nbytes() == NUM_BLOCKS * mmap.PAGESIZE  # a page a block
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for _ in range(NUM_REQUESTS):
        engine.add_request([rng.randrange(1000, 40000) for _ in range(30)], params)
    while engine.has_unfinished():
        engine.step()
    resident = [_resident_pages(t) for pair in engine.runner.kv_caches for t in pair]
    return engine, resident


def test_resident_kv_follows_the_peak_of_blocks_in_use(folder: Path) -> None:
    engine, resident = _run_many_short_requests(folder)
    peak = engine.stats().peak_kv_blocks_used
    assert engine.kv.num_handed_out_blocks == peak <= 4 * 3
    # Each layer's K and V hold the written blocks only: at most the peak in use, where the
    # run used 96 * 3 blocks' worth over time.
    assert all(1 <= pages <= peak for pages in resident), (resident, peak)
    assert engine.kv.stats().num_evictions >= NUM_REQUESTS  # the cached blocks were reused


def test_the_committed_pool_order_would_write_a_block_per_block_ever_needed(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same run with the order for a pool committed up front (fresh blocks before cached
    # ones), as on a GPU: the pool's pages follow every block handed out, 32x the peak in use.
    # What the test above guards against.
    monkeypatch.setattr(llm_engine_module, "is_kv_cache_lazy", lambda device: False)
    engine, resident = _run_many_short_requests(folder)
    peak = engine.stats().peak_kv_blocks_used
    assert engine.kv.num_handed_out_blocks >= NUM_REQUESTS * 2  # two full blocks of each cached
    assert all(pages >= NUM_REQUESTS * 2 > 4 * peak for pages in resident), (resident, peak)
    assert engine.kv.stats().num_evictions == 0
