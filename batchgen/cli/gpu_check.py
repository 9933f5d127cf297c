"""`batchgen gpu-check --out DIR`: the prepared GPU check, as one command.

1. the kernel tests compiled (no interpreter), in a pytest subprocess;
2. Triton paged attention timed against SDPA over gathered K/V (batchgen.cli.gpu_kernels);
3. the engine's greedy tokens on the built-in model: Triton attention in float32 and in bfloat16
   against PyTorch attention in float32, differing only where the float32 top-2 logit gap is
   small (batchgen.cli.gpu_engine_check);
4. the engine's output tokens/s with the built-in model in bfloat16 on CUDA: continuous against
   static batching, side by side (`batchgen bench`).
Everything lands in DIR (gpu_check.json, engine_bench.json, logs); the exit code is 2 without
CUDA, 1 if a part failed. A command-line entry point: it may read and edit the environment.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

__all__ = ["ENGINE_CANDIDATES", "run_gpu_check"]

# Gaps (logits) within which a greedy token may differ from the float32 PyTorch engine's. Chosen,
# not measured on a GPU: Triton in float32 may use TF32 dots; bfloat16 keeps ~3 significant
# digits, so logits of ~20 move by a few tenths.
ENGINE_CANDIDATES = (
    ("triton-float32", "triton", "float32", 0.05),
    ("triton-bfloat16", "triton", "bfloat16", 0.5),
)


def run_gpu_check(
    out_dir: Path, *, num_prompts: int, max_tokens: int, max_num_seqs: int, warmup: int = 5, iters: int = 20
) -> int:
    import torch

    if not torch.cuda.is_available():
        print(
            f"gpu-check needs a CUDA GPU and none is visible to torch (torch {torch.__version__}); "
            "on CPU run `pytest tests/kernels` (Triton interpreter).",
            file=sys.stderr,
        )
        return 2
    if os.environ.pop("TRITON_INTERPRET", None) is not None:
        # Read when the kernel modules are imported (not yet, in this process): compile for real.
        print("gpu-check: ignoring TRITON_INTERPRET; kernels run compiled", file=sys.stderr)
    import triton

    from batchgen.cli.bench import run_bench
    from batchgen.cli.gpu_kernels import bench_shape, bench_shapes, print_timings, run_kernel_tests

    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "dtype": "bfloat16",
        "timing": "median ms per call over iters after warmup, L2 flushed, launch included",
    }
    print("running kernel tests on the GPU ...", flush=True)
    report["tests"] = run_kernel_tests(out_dir)
    print(f"tests: {report['tests']}", flush=True)
    torch.manual_seed(0)
    timings = []
    for shape in bench_shapes():
        timings.append(bench_shape(shape, torch.bfloat16, warmup, iters))
        torch.cuda.empty_cache()
    print_timings(timings)
    report["attention"] = [asdict(t) for t in timings]
    report["engine_check"] = _engine_check()
    print(json.dumps(report["engine_check"], indent=2), flush=True)
    try:
        results = run_bench(
            model=None,
            num_prompts=num_prompts,
            max_tokens=max_tokens,
            modes=["continuous", "static"],
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=8192,
            dtype="bfloat16",
            device="cuda",
            out=out_dir / "engine_bench.json",
            use_tqdm=False,
        )
        report["engine"] = {"ok": True, "output_tokens_per_s": {r.mode: r.output_tokens_per_s for r in results}}
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        report["engine"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    path = out_dir / "gpu_check.json"
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["engine"], indent=2))
    print(f"wrote {path}")
    ok = report["tests"].get("returncode", 0) == 0 and report["engine"]["ok"] and report["engine_check"]["ok"]
    return 0 if ok else 1


def _engine_check() -> dict[str, Any]:
    from batchgen.cli.gpu_engine_check import Candidate, run_engine_check

    candidates = [Candidate(*values) for values in ENGINE_CANDIDATES]
    print("comparing the engine's greedy tokens across attention backends and dtypes ...", flush=True)
    try:
        results = run_engine_check(None, device="cuda", candidates=candidates)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": all(r.ok for r in results.values()), **{k: r.as_dict() for k, r in results.items()}}
