"""The CPU kernel's AVX-512 paths (the prefill tile and the decode rows of
kernels/cpu_attention_tile.h) on CPUs without AVX-512, through a test build that emulates the
intrinsics in scalar code (tests/kernels/avx512_emulation.h, BATCHGEN_EMULATE_AVX512).

The project's machines are of two kinds, one with AVX-512 and one without: on the first the
production build runs these paths and test_attention_cpu.py covers them; on the second only
this build does. The emulation checks every aligned load and store's alignment. The first run
on a machine builds the variant (about as long as the production build, then cached).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from batchgen.kernels.attention_cpu import build_cpu_kernel_variant, is_cpu_kernel_available

from .attention_cases import (
    OPTION_CASE,
    WINDOWS,
    in_cpu_layout,
    make_batch,
    max_error,
    naive_attention,
    poison_unseen_blocks,
    run_cpu_module,
    with_query_gain,
)
from .test_attention_cpu import (
    CASES,
    _shared_prefix_decode_batch,
    _window_starts_in_a_shared_block_batch,
)


def _has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel"),
    pytest.mark.skipif(_has_avx512(), reason="this CPU runs the real AVX-512 paths (test_attention_cpu.py)"),
]


@pytest.fixture(scope="module")
def emulated() -> ModuleType:
    module: ModuleType = build_cpu_kernel_variant(
        defines=("BATCHGEN_EMULATE_AVX512",), include_dirs=(Path(__file__).parent,), name="batchgen_cpu_attention_emu512"
    )
    return module


# head_dim 128 and 256: P.V in two and four 64-float passes.
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (9, 3), (16, 2)])
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_emulated_avx512_paths_match_reference(
    emulated: ModuleType, case: str, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    batch = in_cpu_layout(make_batch(*CASES[case], num_heads=num_heads, num_kv_heads=num_kv_heads,
                                     head_dim=head_dim, device=torch.device("cpu")))  # fmt: skip
    assert max_error(run_cpu_module(emulated, batch), naive_attention(batch)) < 2e-5


@pytest.mark.parametrize(
    ("window", "cap"), [(None, 2.0), (None, 30.0), *((w, None) for w in WINDOWS), (5, 30.0), (21, 2.0)]
)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (16, 2)])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_emulated_avx512_window_and_soft_cap(
    emulated: ModuleType, window: int | None, cap: float | None, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    batch = make_batch(*OPTION_CASE, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       device=torch.device("cpu"))  # fmt: skip
    if cap is not None:
        batch = with_query_gain(batch)
    expected = naive_attention(batch, sliding_window=window, logits_soft_cap=cap)
    poisoned = in_cpu_layout(poison_unseen_blocks(batch, window))
    out = run_cpu_module(emulated, poisoned, sliding_window=window, logits_soft_cap=cap)
    assert max_error(out, expected) < (6e-5 if cap is not None else 2e-5)


@pytest.mark.parametrize(("window", "cap"), [(None, None), (40, None), (17, 30.0)])
def test_emulated_avx512_decode_over_shared_blocks(emulated: ModuleType, window: int | None, cap: float | None) -> None:
    """Runs of rows sharing a block, cut into chunks of up to 6 rows that see the same keys."""
    batch = _shared_prefix_decode_batch(16, 2, 128, 16)
    expected = naive_attention(batch, sliding_window=window, logits_soft_cap=cap)
    assert max_error(run_cpu_module(emulated, batch, sliding_window=window, logits_soft_cap=cap), expected) < 2e-5


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (16, 2)])
def test_emulated_avx512_decode_chunks_split_at_window_starts(
    emulated: ModuleType, num_heads: int, num_kv_heads: int
) -> None:
    """Two rows that share a block but start their windows at other keys of it run in separate
    chunks of decode_rows (one chunk masks one key range)."""
    batch = _window_starts_in_a_shared_block_batch(num_heads, num_kv_heads, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # one slice holds both rows
        out = run_cpu_module(emulated, batch, sliding_window=40)
    finally:
        torch.set_num_threads(before)
    assert max_error(out, naive_attention(batch, sliding_window=40)) < 2e-5
