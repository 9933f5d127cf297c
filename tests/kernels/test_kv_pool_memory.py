"""A CPU KV pool is committed as its blocks are written, not when it is allocated (issue 25):
`torch.zeros` made a 4.3 GB pool resident at once while a run used a tenth of it. Measured as
this process's resident set (Linux /proc), around allocations far larger than its noise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from batchgen.kernels import new_kv_cache

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

MIB = 1 << 20


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("backend", ["cpu", "torch"])  # the compiled kernel's layout, and contiguous
def test_a_large_pool_is_not_resident_until_its_blocks_are_written(backend: str) -> None:
    num_blocks, block_size, kv_heads, head_dim = 8192, 16, 2, 64  # 256 MiB each for K and V
    before = _rss_bytes()
    k, v = new_kv_cache(num_blocks, block_size, kv_heads, head_dim, dtype=torch.float32,
                        device=torch.device("cpu"), backend=backend)  # type: ignore[arg-type]
    assert k.shape == v.shape == (num_blocks, block_size, kv_heads, head_dim)
    allocated = _rss_bytes() - before
    assert allocated < 32 * MIB, f"allocating 512 MiB of pool made {allocated / MIB:.0f} MiB resident"
    assert float(k[num_blocks - 1].abs().sum()) == 0.0 and float(v[0].abs().sum()) == 0.0  # reads as zeros
    # writing 1024 blocks (8 KiB each for K and for V: 16 MiB) commits about that, not the pool
    k[:1024] = 1.0
    v[:1024] = 2.0
    written = _rss_bytes() - before
    assert 12 * MIB <= written < 48 * MIB, f"{written / MIB:.0f} MiB resident after writing 16 MiB of blocks"
    assert float(k[:1024].sum()) == 1024 * block_size * kv_heads * head_dim
    assert float(k[1024:].abs().sum()) == 0.0
