"""Linear layers with each weight packed once at load (float32, CPU).

`F.linear` hands every call to MKL's sgemm with the weight in its plain [out, in] layout, and
sgemm repacks that weight into its own blocked layout on every call: at decode batch sizes (tens
of rows) the repacking is a large share of the work. Packing once at load removes it. Two
packers exist in PyTorch builds, the ones its own CPU compiler (inductor with freezing) uses:

- MKL's `cblas_sgemm_pack` (`torch.ops.mkl`), preferred on Intel CPUs without AVX-512: on a 2-core
  AVX-512 Xeon the 30 layers' projections at 64 rows took 67-70 ms against 81-104 for oneDNN and
  84-91 for plain `F.linear`, about the same as plain at prefill sizes (2048 rows), and the
  results equal plain `F.linear`'s bit for bit from 17 rows up (the same MKL kernels without the
  repacking).
- oneDNN's blocked layout (`torch.ops.mkldnn`), for builds without MKL (ARM) and for CPUs not
  made by Intel, on which MKL's sgemm is slower: on a 2-core AMD EPYC (AVX2, no AVX-512) oneDNN
  took 0.8x MKL's time for the 30 layers' projections at 64 rows, 0.55x for the LM head, 0.95x
  at 256 rows, and 1.1x at 2048 rows (prefill-sized chunks).

One MKL-packed copy serves every batch: the buffer's size does not depend on the row count it is
packed for, the results match plain sgemm for any count, and `_mkl_linear` is told the actual
row count, which keeps it on the packed path. The count packed for picks MKL's blocking: 512 is as
fast as 64 at decode sizes and 5% faster at 2048 rows; 1024 and 2048 are 40% slower at decode
sizes. The plain [out, in] weight `_mkl_linear` also takes is read only for its shape, so a
zero-stride stand-in of that shape is passed and the plain copy is freed.
(`jobs/bench/linear_kernel.py` measures the variants.)

bfloat16 products (`RunnerConfig.linear_dtype`, opt-in; `bf16_linear_library` picks the kernel): on
a CPU with AMX-BF16, oneDNN (below), whose tile instructions outrun any vector kernel; else, where
the CPU has AVX512-BF16, batchgen's own kernel (`packed_linear_bf16`, `packed_silu_gate_up_bf16`
in `cpu_linear.h`): the weight is rounded to bfloat16 (to nearest even) once and packed in the float32 kernel's column panels as
pairs of k; each call rounds x to bfloat16 and sums the exact products in float32 with AVX512-BF16
dot products, one chain in k order per output (batch invariant, as the float32 kernel), and
returns float32 without rounding the result. Measured on the 2-core AVX-512 AMD EPYC, 30 layers'
projections: 17.5 ms at 64 rows against oneDNN's bfloat16 26.1 and the float32 kernel's 30.7; 66.5
/ 73.5 / 112.7 at 256; 538 / 512 / 915 at 2,048 (on an Emerald Rapids Xeon, which has AMX, it ran
at half the float32 kernel's speed from 64 rows up, oneDNN at 3.4x-5x). Elsewhere oneDNN: the
float32 weight is rounded to bfloat16 and reordered once into its blocked layout; each call rounds x to bfloat16, multiplies
with float32 accumulation, and oneDNN rounds the result to bfloat16 (this torch has no
float32-output variant on the CPU); `linear` widens it to float32 and adds the bias in float32.
On the 2-core AVX-512 Xeon oneDNN's projections of a SmolLM2 decode step took 2.5x less time than
the packed float32 path at 64 and 256 rows (`jobs/bench/number_formats.py`), with a relative
error of 3e-3 against float64 (float32's: 3e-7). Everything else (attention, norms, the KV cache,
the residual stream) stays float32.

batchgen's own packed kernel (`kernels/cpu_linear.h`, in the compiled CPU extension): the weight in
column panels that a register-blocked AVX-512 kernel walks, asking for the next panel while it
works on this one. At decode sizes the weights stream from memory (537 MB per SmolLM2 step), and
oneDNN's and MKL's kernels wait on them: on the 2-core AVX-512 AMD EPYC, the 30 layers plus the LM
head with cold weights took 38.0 ms at 64 rows against oneDNN's 51.9, 20.3 against 30.5 at 32,
159 against 169 at 256. Each output is one FMA chain in k order, so a row's result does not depend
on the batch around it (batch invariance) and is the same in every build of the kernel. It is the
choice on every CPU with AVX-512. On a 2-core Intel Xeon (Emerald Rapids, 2026-12-05,
`jobs/bench/linear_kernel.py`) it took 29-35 ms against MKL's 36-46 at 16-32 rows, 59-62 against
63-68 at 64, about the same at 128, 182-184 against 164-166 at 256; in whole runs of the ShareGPT
benchmarks (64 requests) single-turn ran 15.1-15.5 s against 16.0-16.9 with MKL's projections and
batchgen's LM head, multi-turn the same (30.4 s both). On AVX2-only CPUs: oneDNN, or MKL on
Intel's (the AVX2 build of the kernel exists, tested, not measured faster).

`linear` takes a plain weight or a packed one, so the model calls one function; `F.linear` on
plain weights stays the reference path (attention backend "torch"). Imports torch only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .attention_cpu import _cpu_flags as _cpu_flags_line
from .attention_cpu import _named, is_cpu_kernel_available, load_cpu_kernel

__all__ = [
    "PackedLinear",
    "batchgen_bf16_linear",
    "batchgen_linear_panel",
    "bf16_linear_library",
    "bf16_linear_supported",
    "cpu_flags",
    "cpu_vendor",
    "linear",
    "onednn_bf16_supported",
    "pack_linear_weight",
    "pack_silu_gate_up",
    "packed_linear_library",
    "packing_libraries",
    "silu_gate_up",
]

# The row count the packers are told: it picks MKL's blocking (see above); oneDNN tunes for it.
_PACK_ROWS = 512


@dataclass(frozen=True)
class PackedLinear:
    """A [out, in] float32 weight packed once; `linear` takes it in place of the plain weight."""

    packed: torch.Tensor  # opaque (layout torch._mkldnn) from MKL or oneDNN; [P, in, panel] for "batchgen"
    shape: torch.Tensor  # zero-stride float32 [out, in]: the shape `_mkl_linear` reads
    library: str  # "mkl", "onednn" or "batchgen"
    compute_dtype: torch.dtype = torch.float32  # bfloat16: bf16 operands and result (oneDNN), widened
    gated: bool = False  # a gated MLP's [gate | up] packed for `silu_gate_up`, which `linear` refuses

    @property
    def out_features(self) -> int:
        return int(self.shape.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.shape.shape[1])


@functools.cache
def packing_libraries() -> tuple[str, ...]:
    """The packers this torch build has, of "mkl" and "onednn" (in that order)."""
    found = []
    mkl = torch.ops.mkl
    if torch.backends.mkl.is_available() and all(  # type: ignore[no-untyped-call]
        hasattr(mkl, n) for n in ("_mkl_reorder_linear_weight", "_mkl_linear")
    ):
        found.append("mkl")
    dnn = torch.ops.mkldnn
    if torch.backends.mkldnn.is_available() and all(  # type: ignore[no-untyped-call]
        hasattr(dnn, n) for n in ("_reorder_linear_weight", "_linear_pointwise")
    ):
        found.append("onednn")
    return tuple(found)


def batchgen_linear_panel() -> int:
    """The panel width of batchgen's packed linear kernel in this machine's build of the CPU
    extension (48 with AVX-512, 16 with AVX2 only), or 0 where there is none (no compiler, a CPU
    without AVX2). Builds the extension on first use."""
    return _panel_widths()[0]


@functools.cache
def _panel_widths() -> tuple[int, int]:
    """(linear panel width, gated half width) of this machine's build; (0, 0) where there is none."""
    if not is_cpu_kernel_available():
        return 0, 0
    panel, half = load_cpu_kernel().linear_panel_widths()
    return int(panel), int(half)


def cpu_vendor() -> str:
    """The CPU's vendor id from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD", ...; "" where
    there is none, as on ARM or off Linux)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.partition(":")[2].strip() for line in lines if line.startswith("vendor_id")), "")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo ("avx512f", "amx_bf16", ...; empty where there
    are none, as off Linux): the line the kernel build keys its cache on."""
    line = _cpu_flags_line()
    return frozenset(line.partition(":")[2].split()) if line.startswith("flags") else frozenset()


@functools.cache
def packed_linear_library() -> str | None:
    """The packer the models use (see the module docstring): batchgen's kernel on a CPU with
    AVX-512; else "mkl" on an Intel CPU and "onednn" on others; whichever the build has where the
    preferred one is missing; None where there is none."""
    panel = batchgen_linear_panel()
    if panel == 48:  # the AVX-512 build
        preferred: tuple[str, ...] = ("batchgen", "onednn", "mkl")
    elif cpu_vendor() == "GenuineIntel":
        preferred = ("mkl", "onednn", "batchgen")
    else:
        preferred = ("onednn", "mkl", "batchgen")
    found = (*packing_libraries(), *(("batchgen",) if panel else ()))
    return next((lib for lib in preferred if lib in found), None)


@functools.cache
def batchgen_bf16_linear() -> bool:
    """Whether this machine's build of the CPU extension has batchgen's bfloat16 linear kernels
    (a CPU with AVX512-BF16's dot products). Builds the extension on first use."""
    return is_cpu_kernel_available() and hasattr(load_cpu_kernel(), "packed_linear_bf16")


@functools.cache
def bf16_linear_supported() -> bool:
    """Whether bfloat16 linear layers run here: batchgen's kernel (AVX512-BF16), or this torch
    build's oneDNN ones (AVX512-BF16, AMX, or their emulation on AVX-512; oneDNN says no on CPUs
    without AVX-512)."""
    return batchgen_bf16_linear() or onednn_bf16_supported()


@functools.cache
def bf16_linear_library() -> str | None:
    """Which kernel runs bfloat16 linear layers here (`linear_dtype` bfloat16): oneDNN on a CPU
    with AMX-BF16, whose tile instructions it uses (on a 2-core Xeon, Emerald Rapids, SmolLM2's
    projections took 0.29x the packed float32 path's time at 64 rows and 0.20x at 256, where
    batchgen's AVX512-BF16 kernel took 1.95x and 1.88x: `jobs/bench/number_formats.py`); else
    batchgen's kernel where this build has it (AVX512-BF16); else oneDNN where it has bfloat16;
    None where neither runs."""
    if "amx_bf16" in cpu_flags() and onednn_bf16_supported():
        return "onednn"
    if batchgen_bf16_linear():
        return "batchgen"
    return "onednn" if onednn_bf16_supported() else None


@functools.cache
def onednn_bf16_supported() -> bool:
    """Whether this torch build and CPU run oneDNN's bfloat16 linear layers (the bfloat16 path where
    batchgen's kernel is not built)."""
    dnn = torch.ops.mkldnn
    names = ("_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported")
    return bool(
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and all(hasattr(dnn, n) for n in names)
        and dnn._is_mkldnn_bf16_supported()
    )


def pack_linear_weight(
    weight: torch.Tensor, library: str | None = None, compute_dtype: torch.dtype = torch.float32
) -> PackedLinear:
    """`weight` ([out, in], float32, CPU) packed for `linear`; `library` forces "mkl", "onednn" or
    "batchgen". `compute_dtype` bfloat16 packs a bfloat16 copy for the kernel `bf16_linear_library`
    names unless `library` forces one (see the module docstring); raises RuntimeError where
    `bf16_linear_supported()` is false."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"pack_linear_weight takes a 2-D float32 CPU tensor, got {weight.dtype} {tuple(weight.shape)}")
    if compute_dtype == torch.bfloat16:
        if library == "batchgen" or (library is None and bf16_linear_library() == "batchgen"):
            if not batchgen_bf16_linear():
                raise RuntimeError("batchgen's bfloat16 linear kernel needs a CPU with AVX512-BF16")
            return _pack_panels(weight, compute_dtype=torch.bfloat16)
        if not onednn_bf16_supported():
            raise RuntimeError("bfloat16 linear layers need AVX512-BF16 or oneDNN with bfloat16 support (a CPU with AVX-512)")
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous().to(torch.bfloat16), _PACK_ROWS)
        return PackedLinear(packed=packed, shape=_shape_of(weight), library="onednn", compute_dtype=torch.bfloat16)
    if compute_dtype != torch.float32:
        raise ValueError(f"pack_linear_weight computes in float32 or bfloat16, not {compute_dtype}")
    library = library or packed_linear_library()
    if library == "batchgen":
        return _pack_panels(weight)
    if library not in ("mkl", "onednn"):
        raise RuntimeError(f"no linear packer for {library!r}: this torch build has neither MKL nor oneDNN")
    w = weight.contiguous()
    if library == "mkl":
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, _PACK_ROWS)
    else:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, _PACK_ROWS)
    return PackedLinear(packed=packed, shape=_shape_of(weight), library=library)


def _pack_panels(
    weight: torch.Tensor, panel: int | None = None, compute_dtype: torch.dtype = torch.float32
) -> PackedLinear:
    """[out, in] as batchgen's kernel reads it: [P, in, panel], panel p holding output columns
    p * panel .. p * panel + panel - 1 (zeros past out); for bfloat16 products (`compute_dtype`)
    [P, ceil(in / 2), panel] pairs of bfloat16 (`_as_bf16_pairs`). `panel`: this machine's build's
    width unless given (tests pack for other builds)."""
    panel = panel or batchgen_linear_panel()
    if not panel:
        raise RuntimeError("batchgen's packed linear kernel needs the compiled CPU extension on a CPU with AVX2")
    return _packed_panels(_in_panels(weight, panel), weight, compute_dtype)


def _packed_panels(
    panels: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype, *, gated: bool = False
) -> PackedLinear:
    """[P, panel, in] panels of `weight` as batchgen's kernel for `compute_dtype` reads them: float32
    [P, in, panel], or bfloat16 pairs [P, ceil(in / 2), panel] (`_as_bf16_pairs`)."""
    packed = _as_bf16_pairs(panels) if compute_dtype == torch.bfloat16 else panels.transpose(1, 2).contiguous()
    return PackedLinear(packed=packed, shape=_shape_of(weight), library="batchgen", compute_dtype=compute_dtype, gated=gated)


def _as_bf16_pairs(panels: torch.Tensor) -> torch.Tensor:
    """[P, panel, in] float32 rounded to bfloat16 (to nearest even) and laid out as the bfloat16
    kernel reads it: [P, ceil(in / 2), panel] int32, each unit the pair k = 2i, 2i + 1 of one
    column (a zero past the last k where `in` is odd)."""
    p, panel, in_features = panels.shape
    even = panels.new_zeros(p, panel, in_features + in_features % 2, dtype=torch.bfloat16)
    even[..., :in_features] = panels
    pairs = even.view(p, panel, -1, 2).permute(0, 2, 1, 3).contiguous()  # [P, in / 2, panel, 2]
    return pairs.view(torch.int32).squeeze(-1)


def _in_panels(rows: torch.Tensor, panel: int) -> torch.Tensor:
    """[n, in] zero-padded to whole panels and viewed as [P, panel, in]."""
    n, in_features = rows.shape
    panels = -(-n // panel)
    padded = rows.new_zeros(panels * panel, in_features)
    padded[:n] = rows
    return padded.view(panels, panel, in_features)


def _shape_of(weight: torch.Tensor) -> torch.Tensor:
    """A zero-stride float32 stand-in of weight's [out, in] shape (what `_mkl_linear` reads)."""
    return torch.empty(1, 1, dtype=torch.float32).expand(weight.shape)


def pack_silu_gate_up(weight: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> PackedLinear:
    """A gated MLP's fused [gate | up] ([2n, in], float32) packed for `silu_gate_up`: panels of
    the kernel's half width of gate columns, each followed by the same up columns (zeros past n);
    `compute_dtype` bfloat16 for bfloat16 products (as `pack_linear_weight`'s). Raises
    RuntimeError where batchgen's kernel (for bfloat16: its bfloat16 kernel) is not built here."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[0] % 2:
        raise ValueError(f"pack_silu_gate_up takes a 2-D float32 CPU [2n, in] tensor, got {weight.dtype} {tuple(weight.shape)}")
    half = _gated_panel_half()
    if not half:
        raise RuntimeError("batchgen's gated linear kernel needs the compiled CPU extension on a CPU with AVX2")
    gate, up = weight.chunk(2)
    if compute_dtype == torch.bfloat16 and not batchgen_bf16_linear():
        raise RuntimeError("batchgen's bfloat16 gated kernel needs a CPU with AVX512-BF16")
    panels = torch.cat([_in_panels(gate, half), _in_panels(up, half)], dim=1)  # [P, gate | up, in]
    return _packed_panels(panels, weight, compute_dtype, gated=True)


def _gated_panel_half() -> int:
    return _panel_widths()[1]


def silu_gate_up(x: torch.Tensor, weight: PackedLinear) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) for a weight from `pack_silu_gate_up`: the same bits as
    `silu_and_mul` of `linear` over the weight packed plainly, without the [T, 2n] product."""
    if not weight.gated:
        raise ValueError("silu_gate_up takes a weight packed by pack_silu_gate_up")
    kernel = load_cpu_kernel()
    run = kernel.packed_silu_gate_up_bf16 if weight.compute_dtype == torch.bfloat16 else kernel.packed_silu_gate_up
    with _named("batchgen::packed_linear_cpu"):
        out: torch.Tensor = run(x.contiguous(), weight.packed, weight.out_features // 2)
    return out


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] times a oneDNN-packed weight (`torch.ops.mkldnn._linear_pointwise`), with M padded
    with zero rows to a bucket (`onednn_rows`) and the padding dropped from the result.

    This torch's oneDNN linear keeps memory about the size of the result for every row count it
    has seen (measured: a [49152, 576] weight called at 1 to 299 rows grew the resident set by
    4.2 GB in bfloat16, 2.7 GB in float32 up to 170 rows; the same count again adds nothing), and a
    run's steps see hundreds of counts. Buckets bound that to a few dozen counts."""
    m = x.shape[0]
    rows = onednn_rows(m)
    if rows != m:
        x = torch.cat([x, x.new_zeros(rows - m, x.shape[1])])
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return out[:m]


def onednn_rows(m: int) -> int:
    """The row count `onednn_linear` runs for m rows: m rounded up to a multiple of 8 up to 64, of
    32 up to 256 (decode batches), of 256 above (prefill chunks, mostly the whole 2,048-token
    budget): 21 counts up to 2,048 rows."""
    step = 8 if m <= 64 else 32 if m <= 256 else 256
    return -(-m // step) * step


def linear(x: torch.Tensor, weight: torch.Tensor | PackedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias for 2-D x, with a plain weight or one from `pack_linear_weight`."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    if weight.gated:
        raise ValueError("a gate/up weight packed for silu_gate_up is not a linear layer's: call silu_gate_up")
    x = x.contiguous()
    out: torch.Tensor
    if weight.library == "batchgen":
        kernel = load_cpu_kernel()
        run = kernel.packed_linear_bf16 if weight.compute_dtype == torch.bfloat16 else kernel.packed_linear
        with _named("batchgen::packed_linear_cpu"):  # a profiler sees the C++ call under this name
            out = run(x, weight.packed, weight.out_features, bias)
    elif weight.compute_dtype == torch.bfloat16:  # oneDNN's bfloat16
        out = onednn_linear(x.to(torch.bfloat16), weight.packed).float()
        return out if bias is None else out.add_(bias)
    elif weight.library == "mkl":
        # The row count passed is x's own, so MKL always takes the packed path.
        out = torch.ops.mkl._mkl_linear(x, weight.packed, weight.shape, bias, x.shape[0])
    else:
        out = onednn_linear(x, weight.packed, bias)
    return out
