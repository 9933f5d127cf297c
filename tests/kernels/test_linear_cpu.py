"""Linear layers with packed weights (MKL, oneDNN, batchgen's kernel) against F.linear, and the model's choice."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from batchgen.kernels import (
    PackedLinear,
    bf16_linear_supported,
    linear,
    linear_cpu,
    pack_linear_weight,
    packed_linear_library,
    packing_libraries,
    silu_and_mul,
)
from batchgen.models.checkpoint import load_checkpoint
from batchgen.models.llama import LlamaModel

needs_packing = pytest.mark.skipif(packed_linear_library() is None, reason="torch built without MKL or oneDNN")
needs_mkl = pytest.mark.skipif("mkl" not in packing_libraries(), reason="torch built without MKL's packed sgemm")
needs_onednn = pytest.mark.skipif("onednn" not in packing_libraries(), reason="torch built without oneDNN")
LIBRARIES = [pytest.param("mkl", marks=needs_mkl), pytest.param("onednn", marks=needs_onednn)]


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("rows", [0, 1, 3, 17, 64, 257])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_f_linear(library: str, rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 40, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    x = torch.randn(rows, 40, generator=gen)
    packed = pack_linear_weight(weight, library)
    assert isinstance(packed, PackedLinear) and packed.library == library
    assert (packed.out_features, packed.in_features) == (96, 40) and packed.packed.is_mkldnn
    out = linear(x, packed, bias)
    assert out.shape == (rows, 96) and out.dtype == torch.float32 and not out.is_mkldnn
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@needs_mkl
@pytest.mark.parametrize("rows", [17, 50, 64, 65, 200, 700, 2048])
def test_mkl_packing_serves_every_row_count_bit_for_bit(rows: int) -> None:
    # One packed copy (packed for 512 rows) serves any batch: the results are plain sgemm's, bit for
    # bit, at the model's real projection shapes, so a broken layout cannot hide in a tolerance.
    gen = torch.Generator().manual_seed(rows)
    for out_features, in_features in [(960, 576), (576, 1536), (3072, 576)]:
        weight = torch.randn(out_features, in_features, generator=gen)
        x = torch.randn(rows, in_features, generator=gen)
        assert torch.equal(linear(x, pack_linear_weight(weight, "mkl")), F.linear(x, weight))


@pytest.mark.parametrize("library", LIBRARIES)
def test_packed_linear_takes_a_strided_input(library: str) -> None:
    weight = torch.randn(16, 8)
    x = torch.randn(10, 16)[:, ::2]  # a view with row stride 16
    torch.testing.assert_close(linear(x, pack_linear_weight(weight, library)), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_plain_weights_take_f_linear() -> None:
    weight, x = torch.randn(6, 4), torch.randn(3, 4)
    assert torch.equal(linear(x, weight), F.linear(x, weight))


@pytest.mark.parametrize("weight", [torch.randn(4, 4, dtype=torch.bfloat16), torch.randn(4)])
def test_pack_rejects_other_dtypes_and_shapes(weight: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="2-D float32 CPU"):
        pack_linear_weight(weight)


@pytest.mark.parametrize(
    ("vendor", "found", "panel", "chosen"),
    [
        ("GenuineIntel", ("mkl", "onednn"), 0, "mkl"),
        ("AuthenticAMD", ("mkl", "onednn"), 0, "onednn"),
        ("", ("mkl", "onednn"), 0, "onednn"),  # ARM, or no /proc/cpuinfo
        ("GenuineIntel", ("onednn",), 0, "onednn"),
        ("AuthenticAMD", ("mkl",), 0, "mkl"),
        ("GenuineIntel", (), 0, None),
        # batchgen's kernel: first where its AVX-512 build (panel 48) runs, on any vendor's CPU
        # (measured faster on an AMD EPYC and an Intel Xeon); last otherwise (its AVX2 build, not
        # measured faster), but before nothing.
        ("AuthenticAMD", ("mkl", "onednn"), 48, "batchgen"),
        ("", ("onednn",), 48, "batchgen"),
        ("AuthenticAMD", ("mkl", "onednn"), 16, "onednn"),
        ("GenuineIntel", ("mkl", "onednn"), 48, "batchgen"),
        ("GenuineIntel", ("mkl", "onednn"), 16, "mkl"),
        ("GenuineIntel", (), 48, "batchgen"),
        ("AuthenticAMD", (), 16, "batchgen"),
    ],
)
def test_the_packer_is_batchgen_on_avx512_then_mkl_on_intel_and_onednn_elsewhere(
    monkeypatch: pytest.MonkeyPatch, vendor: str, found: tuple[str, ...], panel: int, chosen: str | None
) -> None:
    patches = {"cpu_vendor": vendor, "packing_libraries": found, "batchgen_linear_panel": panel}
    assert _choice(monkeypatch, linear_cpu.packed_linear_library, patches) == chosen


def _choice(monkeypatch: pytest.MonkeyPatch, choose: Any, answers: dict[str, object]) -> object:
    """`choose()` (a cached choice of linear_cpu's) with each named function answering its value,
    its cache cleared before and after."""
    for name, value in answers.items():
        monkeypatch.setattr(linear_cpu, name, lambda value=value: value)
    choose.cache_clear()
    try:
        return choose()
    finally:
        choose.cache_clear()


needs_panels = pytest.mark.skipif(
    not linear_cpu.batchgen_linear_panel(), reason="no build of batchgen's packed linear kernel here"
)


def _abs_sum_error(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> float:
    """The largest |out - exact| over the sum of the products' (and the bias's) magnitudes: the
    relative error an FMA chain in float32 can have is about in_features * 6e-8 of that."""
    exact = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    scale = x.double().abs() @ weight.double().abs().T + (0 if bias is None else bias.double().abs())
    return 0.0 if out.numel() == 0 else float(((out.double() - exact).abs() / scale.clamp_min(1e-300)).max())


@needs_panels
@pytest.mark.parametrize(
    ("out_features", "in_features"),
    # whole panels, a last panel of 1, 2 and 47 columns, a single column; in_features 1, odd, the
    # model's, and past one slice of k (2,048: 2,049, and 4,500 in three slices)
    [(96, 40), (49, 7), (50, 1), (1, 3), (95, 17), (960, 576), (576, 1536), (50, 2049), (97, 4500)],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_batchgen_packed_linear_matches_the_exact_product(out_features: int, in_features: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(out_features * 1000 + in_features)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    packed = pack_linear_weight(weight, "batchgen")
    panel = linear_cpu.batchgen_linear_panel()
    assert packed.library == "batchgen" and (packed.out_features, packed.in_features) == (out_features, in_features)
    assert packed.packed.shape == (-(-out_features // panel), in_features, panel)
    # rows: under, at and past a register block (8 or 6 rows), and past a pass over the weights (256)
    for rows in (0, 1, 5, 6, 7, 8, 9, 17, 64, 257, 300):
        x = torch.randn(rows, in_features, generator=gen)
        out = linear(x, packed, bias)
        assert out.shape == (rows, out_features) and out.dtype == torch.float32
        assert _abs_sum_error(out, x, weight, bias) < in_features * 1.2e-7


@needs_panels
def test_batchgen_packed_linear_is_batch_invariant_bit_for_bit() -> None:
    # Each output is one FMA chain in k order whatever the rows around it: a row's result alone, in
    # a register block's remainder, in a full block and past a 256-row pass are the same bits.
    gen = torch.Generator().manual_seed(7)
    for in_features in (576, 5000):  # one slice of k, and three (the sums kept between them)
        weight, bias = torch.randn(150, in_features, generator=gen), torch.randn(150, generator=gen)
        x = torch.randn(300, in_features, generator=gen)
        packed = pack_linear_weight(weight, "batchgen")
        full = linear(x, packed, bias)
        for lo, hi in [(0, 1), (3, 4), (299, 300), (5, 12), (250, 300), (0, 64), (17, 273)]:
            assert torch.equal(linear(x[lo:hi], packed, bias), full[lo:hi]), (in_features, lo, hi)


@needs_panels
def test_batchgen_packed_linear_takes_strided_input_and_refuses_bad_shapes() -> None:
    weight = torch.randn(20, 8)
    packed = pack_linear_weight(weight, "batchgen")
    x = torch.randn(10, 16)[:, ::2]
    torch.testing.assert_close(linear(x, packed), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    kernel = linear_cpu.load_cpu_kernel()
    with pytest.raises(RuntimeError, match="columns"):
        kernel.packed_linear(torch.randn(3, 9), packed.packed, 20)
    with pytest.raises(RuntimeError, match="does not fit"):
        kernel.packed_linear(torch.randn(3, 8), packed.packed, 20 + linear_cpu.batchgen_linear_panel())
    with pytest.raises(RuntimeError, match="bias"):
        kernel.packed_linear(torch.randn(3, 8), packed.packed, 20, torch.randn(19))


@needs_panels
@pytest.mark.parametrize(
    ("intermediate", "in_features"), [(1536, 576), (56, 7), (40, 16), (8, 3), (96, 1), (40, 4500)]
)
def test_silu_gate_up_is_silu_and_mul_of_the_product_bit_for_bit(intermediate: int, in_features: int) -> None:
    # The fused op's products are packed_linear's FMA chains and its activation silu_and_mul's
    # arithmetic lane for lane (whole 8-float groups: silu_and_mul's scalar tail is libm's exp).
    gen = torch.Generator().manual_seed(intermediate + in_features)
    weight = torch.randn(2 * intermediate, in_features, generator=gen)
    plain, fused = pack_linear_weight(weight, "batchgen"), linear_cpu.pack_silu_gate_up(weight)
    assert fused.gated and (fused.out_features, fused.in_features) == (2 * intermediate, in_features)
    for rows in (0, 1, 5, 6, 7, 13, 64, 257, 300):
        x = torch.randn(rows, in_features, generator=gen)
        out = linear_cpu.silu_gate_up(x, fused)
        assert out.shape == (rows, intermediate)
        assert torch.equal(out, silu_and_mul(linear(x, plain)))
        gate, up = F.linear(x.double(), weight.double()).chunk(2, dim=-1)
        exact = F.silu(gate) * up
        assert rows == 0 or float((out.double() - exact).abs().max()) < 1e-5 * (1 + float(exact.abs().max()))


@needs_panels
def test_silu_gate_up_with_a_partial_last_panel_and_its_refusals() -> None:
    weight = torch.randn(2 * 50, 9)
    fused = linear_cpu.pack_silu_gate_up(weight)
    x = torch.randn(11, 18)[:, ::2]  # strided
    gate, up = F.linear(x, weight).chunk(2, dim=-1)
    torch.testing.assert_close(linear_cpu.silu_gate_up(x, fused), F.silu(gate) * up, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="not a linear layer's"):
        linear(x, fused)
    with pytest.raises(ValueError, match="packed by pack_silu_gate_up"):
        linear_cpu.silu_gate_up(x, pack_linear_weight(weight, "batchgen"))
    with pytest.raises(ValueError, match=r"\[2n, in\]"):
        linear_cpu.pack_silu_gate_up(torch.randn(7, 4))


def test_cpu_vendor_reads_this_machine() -> None:
    expected = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        expected = next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    assert linear_cpu.cpu_vendor() == expected


def test_pack_rejects_an_unknown_library() -> None:
    with pytest.raises(RuntimeError, match="no linear packer for 'blas'"):
        pack_linear_weight(torch.randn(4, 4), "blas")


@needs_packing
def test_model_packs_on_cpu_float32_and_the_torch_backend_keeps_the_reference(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Imported here: tests.tiny_models imports gguf, which the GPU machine lacks, and the module
    # must collect there.
    from tests.tiny_models import make_tiny_hf_folder

    folder = make_tiny_hf_folder(tmp_path / "m", num_heads=4, num_kv_heads=2, head_dim=16)
    checkpoint = load_checkpoint(str(folder))

    def build(backend: str | None, dtype: torch.dtype = torch.float32) -> LlamaModel:
        return LlamaModel(
            checkpoint.config, checkpoint.weights, device=torch.device("cpu"), dtype=dtype,
            max_model_len=64, attention_backend=backend,  # type: ignore[arg-type]
        )  # fmt: skip

    fast, reference = build(None), build("torch")
    assert fast.packed_linear and isinstance(fast.layers[0].attention.qkv, PackedLinear) and isinstance(fast.lm_head, PackedLinear)
    assert fast.layers[0].attention.qkv.library == packed_linear_library()
    assert isinstance(fast.embed, torch.Tensor)  # the embedding lookup needs the plain (tied) matrix
    assert not reference.packed_linear and isinstance(reference.layers[0].attention.qkv, torch.Tensor)
    assert not build(None, torch.bfloat16).packed_linear


needs_bf16 = pytest.mark.skipif(not bf16_linear_supported(), reason="no bfloat16 linear layers on this CPU")
needs_onednn_bf16 = pytest.mark.skipif(
    not linear_cpu.onednn_bf16_supported(), reason="no oneDNN bfloat16 linear layers on this CPU"
)
needs_bf16_kernel = pytest.mark.skipif(not linear_cpu.batchgen_bf16_linear(), reason="no AVX512-BF16 on this CPU")


@needs_onednn_bf16
@pytest.mark.parametrize("rows", [1, 3, 17, 64, 257])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_linear_is_the_bf16_product_widened_then_the_float32_bias(rows: int, with_bias: bool) -> None:
    # oneDNN multiplies the bfloat16-rounded operands with float32 accumulation and rounds the
    # result to bfloat16; `linear` widens it and adds the bias in float32. So the result minus the
    # bias is exactly representable in bfloat16 (a path that stayed float32 fails that), and it is
    # within one bfloat16 rounding of the float64 product of the rounded operands (a path that
    # rounded only one operand, or mis-laid the packed weight, fails that).
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 200, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    x = torch.randn(rows, 200, generator=gen)
    packed = pack_linear_weight(weight, "onednn", compute_dtype=torch.bfloat16)
    assert packed.compute_dtype == torch.bfloat16 and packed.library == "onednn"
    assert (packed.out_features, packed.in_features) == (96, 200)
    out = linear(x, packed, bias)
    assert out.shape == (rows, 96) and out.dtype == torch.float32 and not out.is_mkldnn
    product = out if bias is None else out - bias
    if bias is None:
        assert torch.equal(product, product.bfloat16().float())
    reference = x.bfloat16().double() @ weight.bfloat16().double().T
    half_ulp = torch.exp2(torch.floor(torch.log2(reference.abs().clamp_min(1e-30))) - 8)  # bfloat16: 8 bits
    scale = (x.bfloat16().double().abs() @ weight.bfloat16().double().abs().T) * 2**-20  # float32 sums
    assert ((product.double() - reference).abs() <= half_ulp + scale).all()


@needs_bf16
def test_bf16_linear_takes_a_strided_input_and_refuses_other_compute_dtypes() -> None:
    weight = torch.randn(16, 8)
    x = torch.randn(10, 16)[:, ::2]
    packed = pack_linear_weight(weight, compute_dtype=torch.bfloat16)
    torch.testing.assert_close(linear(x, packed), linear(x.contiguous(), packed))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        pack_linear_weight(weight, compute_dtype=torch.float16)


def test_bf16_packing_without_support_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_cpu, "batchgen_bf16_linear", lambda: False)
    monkeypatch.setattr(linear_cpu, "onednn_bf16_supported", lambda: False)
    with pytest.raises(RuntimeError, match="bfloat16 linear layers need AVX512-BF16 or oneDNN"):
        linear_cpu.pack_linear_weight(torch.randn(4, 4), compute_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="bfloat16 linear kernel needs a CPU with AVX512-BF16"):
        linear_cpu.pack_linear_weight(torch.randn(4, 4), "batchgen", compute_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="bfloat16 gated kernel needs a CPU with AVX512-BF16"):
        linear_cpu.pack_silu_gate_up(torch.randn(8, 4), torch.bfloat16)


def _bf16_reference(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 product of the bfloat16-rounded operands, and the sum of its terms' sizes."""
    xb, wb = x.bfloat16().double(), weight.bfloat16().double()
    return xb @ wb.T, xb.abs() @ wb.abs().T


@needs_bf16_kernel
@pytest.mark.parametrize(("rows", "k"), [(1, 7), (3, 200), (17, 576), (64, 1536), (257, 200), (9, 4097)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_kernel_sums_the_bf16_products_in_float32(rows: int, k: int, with_bias: bool) -> None:
    # batchgen's bfloat16 kernel rounds x and the weight to bfloat16 (to nearest even), and sums
    # their products in float32 (AVX512-BF16 dot products) without rounding the result to
    # bfloat16. So the result is within float32 summation error (K terms, 2^-24 each, relative
    # to the sum of the terms' sizes) of the float64 product of the rounded operands: a kernel
    # that rounded its result to bfloat16 (2^-9 relative), skipped rounding x or the weight, or
    # mis-laid the pairs fails that. K = 7 and 4,097 are odd (a zero pads the last pair); 4,097
    # spans two of the kernel's k slices.
    gen = torch.Generator().manual_seed(rows * k)
    weight = torch.randn(101, k, generator=gen)
    bias = torch.randn(101, generator=gen) if with_bias else None
    x = torch.randn(rows, k, generator=gen)
    packed = pack_linear_weight(weight, "batchgen", compute_dtype=torch.bfloat16)
    assert (packed.library, packed.compute_dtype, packed.packed.dtype) == ("batchgen", torch.bfloat16, torch.int32)
    assert (packed.out_features, packed.in_features) == (101, k)
    out = linear(x, packed, bias)
    assert out.shape == (rows, 101) and out.dtype == torch.float32
    reference, size = _bf16_reference(x, weight)
    if bias is not None:
        reference, size = reference + bias.double(), size + bias.double().abs()
    assert ((out.double() - reference).abs() <= (k + 2) * 2**-24 * size).all()
    if 64 <= k <= 1536:  # the bound is tight enough to tell: the product with x left in float32 is outside it
        unrounded = x.double() @ weight.bfloat16().double().T
        assert ((unrounded - _bf16_reference(x, weight)[0]).abs() > (k + 2) * 2**-24 * size).any()


@needs_bf16_kernel
def test_bf16_kernel_rows_do_not_depend_on_the_batch() -> None:
    # Each output is one chain of dot products in k order: a row's bits are the same alone, in a
    # block of 8 rows or past the kernel's 256-row pass.
    gen = torch.Generator().manual_seed(3)
    weight, x = torch.randn(200, 333, generator=gen), torch.randn(300, 333, generator=gen)
    packed = pack_linear_weight(weight, compute_dtype=torch.bfloat16)
    full = linear(x, packed)
    for r in (0, 7, 8, 255, 256, 299):
        assert torch.equal(linear(x[r : r + 1], packed), full[r : r + 1])
    assert torch.equal(linear(x[5:40], packed), full[5:40])


@needs_bf16_kernel
@pytest.mark.parametrize(("n", "k"), [(104, 65), (1536, 576)])
def test_bf16_gated_kernel_equals_linear_then_silu_and_mul(n: int, k: int) -> None:
    # The fused bfloat16 gate/up gives the bits of the bfloat16 linear over [gate | up] followed by
    # silu_and_mul, as the float32 one does (whole 8-float groups: silu_and_mul's scalar tail is
    # libm's exp).
    gen = torch.Generator().manual_seed(n + k)
    weight = torch.randn(2 * n, k, generator=gen)
    gated = linear_cpu.pack_silu_gate_up(weight, torch.bfloat16)
    plain = pack_linear_weight(weight, "batchgen", compute_dtype=torch.bfloat16)
    assert gated.gated and gated.compute_dtype == torch.bfloat16 and not plain.gated
    for rows in (1, 6, 7, 64, 300):
        x = torch.randn(rows, k, generator=gen)
        fused = linear_cpu.silu_gate_up(x, gated)
        assert fused.shape == (rows, n) and torch.equal(fused, silu_and_mul(linear(x, plain)))


@needs_bf16_kernel
@needs_onednn_bf16
def test_bf16_packs_for_the_chosen_kernel_unless_one_is_asked() -> None:
    weight = torch.randn(16, 8)
    assert pack_linear_weight(weight, compute_dtype=torch.bfloat16).library == linear_cpu.bf16_linear_library()
    assert pack_linear_weight(weight, "batchgen", compute_dtype=torch.bfloat16).library == "batchgen"
    assert pack_linear_weight(weight, "onednn", compute_dtype=torch.bfloat16).library == "onednn"


@pytest.mark.parametrize(
    ("amx", "batchgen", "onednn", "chosen"),
    [
        # AMX-BF16: oneDNN's tile instructions (3.4-5x the float32 path on an Emerald Rapids Xeon,
        # where batchgen's AVX512-BF16 kernel ran at half its speed).
        (True, True, True, "onednn"),
        (True, False, True, "onednn"),
        (True, True, False, "batchgen"),  # a torch build without oneDNN's bfloat16
        (False, True, True, "batchgen"),
        (False, False, True, "onednn"),
        (False, False, False, None),
    ],
)
def test_the_bf16_kernel_is_onednn_with_amx_then_batchgens(
    monkeypatch: pytest.MonkeyPatch, amx: bool, batchgen: bool, onednn: bool, chosen: str | None
) -> None:
    flags = frozenset({"avx512f", "avx512_bf16", *(("amx_bf16", "amx_tile") if amx else ())})
    patches = {"cpu_flags": flags, "batchgen_bf16_linear": batchgen, "onednn_bf16_supported": onednn}
    assert _choice(monkeypatch, linear_cpu.bf16_linear_library, patches) == chosen


def test_cpu_flags_reads_this_machine() -> None:
    flags = linear_cpu.cpu_flags()
    assert isinstance(flags, frozenset)
    if Path("/proc/cpuinfo").exists() and linear_cpu.cpu_vendor() in ("GenuineIntel", "AuthenticAMD"):
        assert "sse2" in flags  # every x86-64 CPU has it


def test_onednn_row_buckets() -> None:
    # 8 rows apart up to 64, 32 up to 256, 256 above: few counts, little padding where it costs.
    assert [linear_cpu.onednn_rows(m) for m in (1, 8, 9, 64, 65, 96, 250, 256, 257, 2048, 2049)] == [
        8, 8, 16, 64, 96, 96, 256, 256, 512, 2048, 2304,
    ]
    assert len({linear_cpu.onednn_rows(m) for m in range(1, 2049)}) == 21


def _rss_anon_mb() -> float:
    import re
    from pathlib import Path

    status = Path("/proc/self/status").read_text()
    return int(re.search(r"RssAnon:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_onednn_memory_does_not_grow_with_each_row_count(dtype: torch.dtype) -> None:
    # torch's oneDNN linear keeps about a result's worth of memory for every row count it sees:
    # 1..120 rows against a [16384, 256] weight grew the resident set by 73 MB (float32) and 254 MB
    # (bfloat16) before the row counts were bucketed, by 21-31 MB after.
    if dtype == torch.bfloat16 and not bf16_linear_supported():
        pytest.skip("no oneDNN bfloat16 linear layers here")
    weight = torch.randn(16384, 256)
    packed = pack_linear_weight(weight, "onednn", compute_dtype=dtype)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(120, 256, generator=gen)
    linear(x[:1], packed)
    before = _rss_anon_mb()
    for m in range(1, 121):
        out = linear(x[:m], packed)
        assert out.shape == (m, 16384)
    assert _rss_anon_mb() - before < 50
    ref = F.linear(x, weight)  # the padding rows dropped, the real ones right
    assert ((out - ref).abs().max() / ref.abs().max()).item() < (1e-2 if dtype == torch.bfloat16 else 1e-5)
