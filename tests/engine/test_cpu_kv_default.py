"""The CPU KV pool's default size: a share of the memory the kernel says is available (free or
reclaimable page cache), not of idle pages alone. A machine that has read its shards and model
holds much of its memory in the page cache; sized from idle pages, the pool came out at 364
blocks with about 10 GB of page cache reclaimable, and the run stopped (too small for one
sequence of max_model_len 8192)."""

from __future__ import annotations

from pathlib import Path

import pytest

import batchgen.engine.llm_engine as llm_engine_module
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine, default_cpu_kv_bytes
from batchgen.engine.runner import ModelRunner
from batchgen.models.checkpoint import load_checkpoint
from tests.tiny_models import make_tiny_hf_folder

MIB = 1 << 20


def _meminfo(tmp_path: Path, free_kb: int, available_kb: int | None) -> str:
    lines = ["MemTotal:       24683832 kB", f"MemFree:        {free_kb} kB"]
    if available_kb is not None:
        lines.append(f"MemAvailable:   {available_kb} kB")
    lines += ["Buffers:           1024 kB", "Cached:         20000000 kB"]
    path = tmp_path / "meminfo"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("available_kb", "expected"),
    [
        (20_000_000, 4096 * MIB),  # a full page cache counts: a quarter of 19 GiB, capped at 4 GiB
        (8_000_000, 8_000_000 * 1024 // 4),  # a quarter of what is available
        (400_000, 256 * MIB),  # the floor
    ],
)
def test_the_default_pool_is_a_quarter_of_available_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, available_kb: int, expected: int
) -> None:
    monkeypatch.setattr(llm_engine_module, "_MEMINFO", _meminfo(tmp_path, free_kb=900_000, available_kb=available_kb))
    assert default_cpu_kv_bytes() == expected


def test_without_memavailable_idle_pages_are_the_measure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_engine_module, "_MEMINFO", _meminfo(tmp_path, free_kb=900_000, available_kb=None))
    monkeypatch.setattr(llm_engine_module.os, "sysconf", lambda name: {"SC_AVPHYS_PAGES": 1 << 20, "SC_PAGE_SIZE": 4096}[name])
    assert default_cpu_kv_bytes() == (4 << 30) // 4


def test_no_meminfo_at_all_falls_back_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_engine_module, "_MEMINFO", str(tmp_path / "absent"))
    monkeypatch.setattr(llm_engine_module.os, "sysconf", lambda name: {"SC_AVPHYS_PAGES": 1 << 18, "SC_PAGE_SIZE": 4096}[name])
    assert default_cpu_kv_bytes() == 256 * MIB


def test_this_machine_reads_its_own_meminfo() -> None:
    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo")
    available = llm_engine_module._available_memory_bytes()
    assert available is not None and available > 0
    assert default_cpu_kv_bytes() == max(256 * MIB, min(4 << 30, available // 4))


@pytest.mark.parametrize("room", ["holds one sequence", "does not"])
def test_the_default_pool_holds_one_longest_sequence_where_memory_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: str
) -> None:
    # A quarter of the memory available can be less than one sequence of max_model_len (another
    # engine's pool beside this one): the default then takes one sequence's worth where the
    # memory available holds it (its pages are committed only as blocks are written), and says
    # clearly that it cannot where it does not.
    checkpoint = load_checkpoint(str(make_tiny_hf_folder(tmp_path, num_heads=2, num_kv_heads=2, hidden_size=64)))
    max_model_len, block_size = 2048, 16
    per_seq = max_model_len // block_size

    def engine() -> LLMEngine:
        return LLMEngine(
            checkpoint,
            scheduler_config=SchedulerConfig(),
            cache_config=CacheConfig(block_size=block_size),
            runner_config=RunnerConfig(max_model_len=max_model_len),
        )

    probe = engine()
    block_bytes = ModelRunner.kv_bytes_per_block(probe.runner.model, block_size)
    available = 2 * per_seq * block_bytes if room == "holds one sequence" else per_seq * block_bytes // 2
    monkeypatch.setattr(llm_engine_module, "_MEMINFO", _meminfo(tmp_path, free_kb=1, available_kb=available // 1024))
    monkeypatch.setattr(llm_engine_module, "_CPU_KV_MIN_BYTES", block_bytes)
    assert default_cpu_kv_bytes() // block_bytes < per_seq  # a quarter is too small either way
    if room == "holds one sequence":
        assert engine().stats().num_kv_blocks == per_seq
    else:
        with pytest.raises(ValueError, match="cannot hold one sequence of max_model_len=2048"):
            engine()
