"""The CPU kernel's tile paths (the prefill tile and the decode rows of
kernels/cpu_attention_tile.h) in the builds a machine's production build does not run:

- "emulated AVX-512": the AVX-512 paths on a CPU without AVX-512, through a test build that
  emulates the intrinsics in scalar code (tests/kernels/avx512_emulation.h,
  BATCHGEN_EMULATE_AVX512); its aligned loads and stores check their alignment;
- "AVX2 halves": the same paths over pairs of AVX2 vectors (kernels/cpu_vec16_avx2.h, the
  production build on CPUs with AVX2 but no AVX-512) on a CPU with AVX-512
  (BATCHGEN_TILE16_AVX2).

The project's machines are of both kinds, so on each one variant runs here and the other is the
production build, which test_attention_cpu.py covers. The halves must give the AVX-512 paths'
results bit for bit (the same operations lane for lane, the same reduction trees): compared with
the emulation where the CPU has no AVX-512, and with the production build where it has. The first
run on a machine builds the variants (about as long as the production build, then cached).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from batchgen.kernels.attention_cpu import (
    build_cpu_kernel_variant,
    is_cpu_kernel_available,
    load_cpu_kernel,
)

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


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


_FLAGS = _cpu_flags()
_HAS_AVX512 = "avx512f" in _FLAGS
_HAS_AVX2 = {"avx2", "fma"} <= _FLAGS

pytestmark = pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")

VARIANTS = [
    pytest.param(
        "emulated AVX-512",
        marks=pytest.mark.skipif(_HAS_AVX512, reason="this CPU runs the real AVX-512 paths (test_attention_cpu.py)"),
    ),
    pytest.param(
        "AVX2 halves",
        marks=pytest.mark.skipif(
            not _HAS_AVX512 or not _HAS_AVX2,
            reason="the production build runs the AVX2 halves on this CPU (test_attention_cpu.py), or it has no AVX2",
        ),
    ),
]


def _build(variant: str) -> ModuleType:
    if variant == "emulated AVX-512":
        module: ModuleType = build_cpu_kernel_variant(
            defines=("BATCHGEN_EMULATE_AVX512",), include_dirs=(Path(__file__).parent,),
            name="batchgen_cpu_attention_emu512",
        )  # fmt: skip
    else:
        module = build_cpu_kernel_variant(defines=("BATCHGEN_TILE16_AVX2",), name="batchgen_cpu_attention_avx2")
    return module


def _halves_and_avx512() -> tuple[ModuleType, ModuleType]:
    """The AVX2-halves build and an AVX-512 one: the halves' test build and the production build
    on a CPU with AVX-512, the production build and the emulation on one without."""
    if _HAS_AVX512:
        return _build("AVX2 halves"), load_cpu_kernel()
    return load_cpu_kernel(), _build("emulated AVX-512")


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> ModuleType:
    """The variant build under test."""
    return _build(request.param)


# head_dim 128 and 256: P.V in two and four 64-float passes.
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (9, 3), (16, 2)])
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_tile_variant_paths_match_reference(
    variant: ModuleType, case: str, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    batch = in_cpu_layout(make_batch(*CASES[case], num_heads=num_heads, num_kv_heads=num_kv_heads,
                                     head_dim=head_dim, device=torch.device("cpu")))  # fmt: skip
    assert max_error(run_cpu_module(variant, batch), naive_attention(batch)) < 2e-5


@pytest.mark.parametrize(
    ("window", "cap"), [(None, 2.0), (None, 30.0), *((w, None) for w in WINDOWS), (5, 30.0), (21, 2.0)]
)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (16, 2)])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_tile_variant_window_and_soft_cap(
    variant: ModuleType, window: int | None, cap: float | None, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    batch = make_batch(*OPTION_CASE, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       device=torch.device("cpu"))  # fmt: skip
    if cap is not None:
        batch = with_query_gain(batch)
    expected = naive_attention(batch, sliding_window=window, logits_soft_cap=cap)
    poisoned = in_cpu_layout(poison_unseen_blocks(batch, window))
    out = run_cpu_module(variant, poisoned, sliding_window=window, logits_soft_cap=cap)
    assert max_error(out, expected) < (6e-5 if cap is not None else 2e-5)


@pytest.mark.parametrize(("window", "cap"), [(None, None), (40, None), (17, 30.0)])
def test_tile_variant_decode_over_shared_blocks(variant: ModuleType, window: int | None, cap: float | None) -> None:
    """Runs of rows sharing a block, cut into chunks of up to kDecodeRows rows (6, or 3 in halves) that see the same keys."""
    batch = _shared_prefix_decode_batch(16, 2, 128, 16)
    expected = naive_attention(batch, sliding_window=window, logits_soft_cap=cap)
    assert max_error(run_cpu_module(variant, batch, sliding_window=window, logits_soft_cap=cap), expected) < 2e-5


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (16, 2)])
def test_tile_variant_decode_chunks_split_at_window_starts(
    variant: ModuleType, num_heads: int, num_kv_heads: int
) -> None:
    """Two rows that share a block but start their windows at other keys of it run in separate
    chunks of decode_rows (one chunk masks one key range)."""
    batch = _window_starts_in_a_shared_block_batch(num_heads, num_kv_heads, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # one slice holds both rows
        out = run_cpu_module(variant, batch, sliding_window=40)
    finally:
        torch.set_num_threads(before)
    assert max_error(out, naive_attention(batch, sliding_window=40)) < 2e-5


@pytest.mark.skipif(not _HAS_AVX2, reason="no AVX2: the halves are not built on this CPU")
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("window", "cap"), [(None, None), (21, 2.0)])
def test_avx2_halves_equal_the_avx512_paths_bit_for_bit(case: str, window: int | None, cap: float | None) -> None:
    """The halves against the AVX-512 paths: the production build against the emulation on a
    CPU without AVX-512, the halves' test build against the production build on one with it."""
    halves, avx512 = _halves_and_avx512()
    for head_dim in (64, 128):
        batch = in_cpu_layout(make_batch(*CASES[case], num_heads=9, num_kv_heads=3, head_dim=head_dim,
                                         device=torch.device("cpu")))  # fmt: skip
        batch = with_query_gain(batch) if cap is not None else batch
        one = run_cpu_module(halves, batch, sliding_window=window, logits_soft_cap=cap)
        other = run_cpu_module(avx512, batch, sliding_window=window, logits_soft_cap=cap)
        assert torch.equal(one, other)
        assert max_error(one, naive_attention(batch, sliding_window=window, logits_soft_cap=cap)) < 6e-5


@pytest.mark.skipif(not _HAS_AVX2, reason="no AVX2: the halves are not built on this CPU")
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_builds_give_the_same_bits(with_bias: bool) -> None:
    """kernels/cpu_linear.h: 16-column panels over AVX2 halves and 48-column panels over AVX-512
    registers (or their emulation) run each output's FMA chain in the same k order, so the two
    builds' products are the same bits, each packed for its own panel width."""
    from batchgen.kernels.linear_cpu import _pack_panels

    halves, avx512 = _halves_and_avx512()
    assert (halves.linear_panel_widths(), avx512.linear_panel_widths()) == ((16, 16), (48, 32))
    gen = torch.Generator().manual_seed(3)
    for out_features, in_features, rows in [(100, 40, 13), (48, 7, 1), (17, 576, 9), (20, 4500, 3)]:
        weight = torch.randn(out_features, in_features, generator=gen)
        bias = torch.randn(out_features, generator=gen) if with_bias else None
        x = torch.randn(rows, in_features, generator=gen)
        one = halves.packed_linear(x, _pack_panels(weight, 16).packed, out_features, bias)
        other = avx512.packed_linear(x, _pack_panels(weight, 48).packed, out_features, bias)
        assert torch.equal(one, other)
        torch.testing.assert_close(one, torch.nn.functional.linear(x, weight, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not _HAS_AVX2, reason="no AVX2: the halves are not built on this CPU")
def test_gated_silu_builds_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused gate/up + silu (16 gate columns a panel over AVX2 halves, 32 over AVX-512) gives
    the same bits in both builds, each packed for its own half width."""
    from batchgen.kernels import linear_cpu

    halves, avx512 = _halves_and_avx512()
    gen = torch.Generator().manual_seed(4)
    for intermediate, in_features, rows in [(40, 24, 7), (64, 576, 5), (8, 3, 1), (16, 4500, 2)]:
        weight = torch.randn(2 * intermediate, in_features, generator=gen)
        x = torch.randn(rows, in_features, generator=gen)
        results = []
        for module in (halves, avx512):
            monkeypatch.setattr(linear_cpu, "_gated_panel_half", lambda module=module: module.linear_panel_widths()[1])
            packed = linear_cpu.pack_silu_gate_up(weight).packed
            results.append(module.packed_silu_gate_up(x, packed, intermediate))
        assert torch.equal(results[0], results[1])
        gate, up = torch.nn.functional.linear(x, weight).chunk(2, dim=-1)
        torch.testing.assert_close(results[0], torch.nn.functional.silu(gate) * up, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not _HAS_AVX2, reason="no AVX2: the halves are not built on this CPU")
def test_greedy_screen_builds_give_the_same_tokens() -> None:
    """kernels/cpu_greedy.h: the portable loops of the AVX2 build and the AVX-512 (or emulated)
    build pick the same tokens, each from its own panels: the float32 argmax."""
    from batchgen.kernels.greedy_cpu import _coef
    from batchgen.kernels.linear_cpu import _pack_panels

    halves, avx512 = _halves_and_avx512()
    gen = torch.Generator().manual_seed(5)
    for vocab, in_features, rows in [(1000, 64, 9), (37, 5, 3), (300, 700, 4)]:
        base = torch.randn(1, in_features, generator=gen)
        weight = torch.cat([base + 1e-2 * torch.randn(vocab // 2, in_features, generator=gen),
                            torch.randn(vocab - vocab // 2, in_features, generator=gen)])
        x = base + 0.3 * torch.randn(rows, in_features, generator=gen)
        # the float64 logits rounded to bfloat16: within the bound (u of each, coef is over 2u)
        estimates = (x.double() @ weight.double().T).to(torch.bfloat16).float()
        norms = weight.double().norm(dim=1).mul(1 + 1e-6).float()
        picked = []
        for module, panel in ((halves, 16), (avx512, 48)):
            packed = _pack_panels(weight, panel).packed
            tokens = module.greedy_screen(estimates, x, packed, norms, _coef(in_features), 512)
            assert torch.equal(tokens, torch.argmax(module.packed_linear(x, packed, vocab, None), dim=-1))
            picked.append(tokens)
        assert torch.equal(picked[0], picked[1])
