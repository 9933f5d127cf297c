"""This CPU's number formats for linear layers, at a model's shapes (issue 25).

usage: python jobs/bench/number_formats.py [--model smollm2-135m|llama-3.2-1b] [--rows 1,64,256]
                                           [--threads 2] [--repeats 20]

Times one decode step's projections (q/k/v, o, gate/up, down, per layer, and the LM head once)
for each way torch offers on the CPU, against the float32 path batchgen runs (weights packed
once for MKL's sgemm, `kernels/linear_cpu.py`):

- f32 plain: `F.linear` on float32 (sgemm repacks the weight on every call).
- bf16 plain / bf16 onednn: bfloat16 activations and weights through `F.linear`, and through
  oneDNN with the weight reordered once (`torch.ops.mkldnn._linear_pointwise`), which is where
  AVX512-BF16 would be used.
- bf16 packed (batchgen): batchgen's bfloat16 kernel (`linear_dtype: bfloat16` where the CPU has
  AVX512-BF16): bfloat16 operands, float32 sums and result.
- f16 onednn: the same with float16 (AVX512-FP16).
- int8 dynamic: W8A8 with per-row dynamic activation scales (`torch.ao` dynamic quantized
  Linear, engine x86/fbgemm or onednn: VNNI).
- int8 weight-only: int8 weights, bfloat16 activations (`aten._weight_int8pack_mm`; float32
  activations with --all: a scalar loop, far slower).

Each variant's time is the median over `--repeats` calls of the layer's projections, summed
over the layer's shapes and multiplied out to the whole model; the first calls are warm-up.
Prints milliseconds a step and the speed-up over the packed float32 path, per row count.
Also prints each format's relative error on one projection against float64.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from batchgen.kernels.linear_cpu import batchgen_bf16_linear, linear, pack_linear_weight

SHAPES = {
    # (hidden, intermediate, heads, kv heads, head_dim, vocab, layers)
    "smollm2-135m": (576, 1536, 9, 3, 64, 49152, 30),
    "llama-3.2-1b": (2048, 8192, 32, 8, 64, 128256, 16),
}


def _projections(model: str) -> tuple[list[tuple[str, int, int, int]], int]:
    """(name, out, in, times per step) of one step's projections, and the layer count."""
    hidden, inter, heads, kv, hd, vocab, layers = SHAPES[model]
    return [
        ("qkv", (heads + 2 * kv) * hd, hidden, layers),
        ("o", hidden, heads * hd, layers),
        ("gate_up", 2 * inter, hidden, layers),
        ("down", hidden, inter, layers),
        ("lm_head", vocab, hidden, 1),
    ], layers


_ALL = False


def _time(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _variants(w: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Each format's linear for float32 weight `w`, taking float32 x; None where unavailable."""
    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    packed = pack_linear_weight(w)
    out["f32 packed (batchgen)"] = lambda x: linear(x, packed)
    out["f32 plain"] = lambda x: F.linear(x, w)
    wb = w.to(torch.bfloat16)
    out["bf16 plain"] = lambda x: F.linear(x.to(torch.bfloat16), wb)
    if batchgen_bf16_linear():
        packed_bf16 = pack_linear_weight(w, "batchgen", compute_dtype=torch.bfloat16)
        out["bf16 packed (batchgen)"] = lambda x: linear(x, packed_bf16)
    dnn = torch.ops.mkldnn
    if torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        for name, dt in (("bf16 onednn", torch.bfloat16), ("f16 onednn", torch.float16)):
            try:
                wp = dnn._reorder_linear_weight(w.to(dt), 512)
                fn = (
                    lambda wp_, dt_: (
                        lambda x: dnn._linear_pointwise(x.to(dt_), wp_, None, "none", [], "")
                    )
                )(wp, dt)
                fn(torch.randn(4, w.shape[1]))
                out[name] = fn
            except RuntimeError as exc:  # not built for this dtype
                print(f"  ({name} unavailable: {str(exc).splitlines()[0]})")
    for engine in ("x86", "onednn", "fbgemm"):
        if engine not in torch.backends.quantized.supported_engines:
            continue
        torch.backends.quantized.engine = engine
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight.data.copy_(w)
        q = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8
        )[0]
        out[f"int8 dynamic ({engine})"] = (lambda m, e: lambda x: _with_engine(e, m, x))(q, engine)
    scales = w.abs().amax(dim=1) / 127.0
    w8 = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    # float32 activations take a scalar loop here (0.01-0.16x of f32 packed on SmolLM2's shapes,
    # 42 s a step at 256 rows): timed only with --all.
    weight_only = [("int8 weight-only, bf16 act", torch.bfloat16)]
    if _ALL:
        weight_only.append(("int8 weight-only, f32 act", torch.float32))
    for name, dt in weight_only:
        s = scales.to(dt)
        try:
            fn = (lambda s_, dt_: lambda x: torch.ops.aten._weight_int8pack_mm(x.to(dt_), w8, s_))(
                s, dt
            )
            fn(torch.randn(4, w.shape[1]))
            out[name] = fn
        except RuntimeError as exc:
            print(f"  ({name} unavailable: {str(exc).splitlines()[0]})")
    return out


def _with_engine(engine: str, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch.backends.quantized.engine = engine
    result: torch.Tensor = module(x)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--rows", default="1,64,256")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--all", action="store_true", help="also the slow variants (int8 weight-only, f32 activations)")
    args = parser.parse_args()
    global _ALL
    _ALL = args.all
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = [int(r) for r in args.rows.split(",")]
    projections, _ = _projections(args.model)
    totals: dict[str, dict[int, float]] = {}
    errors: dict[str, float] = {}
    for name, n_out, n_in, times in projections:
        w = torch.randn(n_out, n_in) * 0.02
        variants = _variants(w)
        x_err = torch.randn(64, n_in)
        ref = (x_err.double() @ w.double().T).float()
        for vname, fn in variants.items():
            if name == "gate_up":
                got = fn(x_err).float()
                errors[vname] = float((got - ref).norm() / ref.norm())
            for m in rows:
                x = torch.randn(m, n_in)
                totals.setdefault(vname, {}).setdefault(m, 0.0)
                totals[vname][m] += _time(lambda fn=fn, x=x: fn(x), args.repeats) * times
        print(f"timed {name} [{n_out} x {n_in}] x {times}", flush=True)
    base = totals["f32 packed (batchgen)"]
    print(
        f"\n{args.model}, {args.threads} threads: the projections of one step (ms) and speed-up over f32 packed"
    )
    header = f"{'format':<30}" + "".join(f"{f'rows {m}':>20}" for m in rows) + f"{'rel. error':>12}"
    print(header)
    for vname, per in totals.items():
        cells = "".join(f"{per[m] * 1e3:>11.2f} ({base[m] / per[m]:4.2f}x)" for m in rows)
        print(f"{vname:<30}{cells}{errors.get(vname, float('nan')):>12.2e}")


if __name__ == "__main__":
    main()
