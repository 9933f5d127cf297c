"""`batchgen gpu-check --out DIR`: the prepared GPU check, as one command.

1. `python -m batchgen.kernels.gpu_check`: kernel tests compiled (no interpreter) and attention
   timings against SDPA over gathered K/V, in a subprocess so TRITON_INTERPRET cannot leak in;
2. the engine's output tokens/s with the built-in model in bfloat16 on CUDA: continuous
   against static batching, side by side (`batchgen bench`).
Everything lands in DIR as JSON and logs; the exit code is non-zero if a part failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["run_gpu_check"]


def run_gpu_check(out_dir: Path, *, num_prompts: int, max_tokens: int, max_num_seqs: int) -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu-check needs a CUDA device; none is visible here", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    kernels = subprocess.run(
        [sys.executable, "-m", "batchgen.kernels.gpu_check", "--out", str(out_dir)], env=env, check=False
    )
    from .bench import run_bench

    engine: dict[str, object]
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
        engine = {"ok": True, "output_tokens_per_s": {r.mode: r.output_tokens_per_s for r in results}}
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        engine = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    (out_dir / "engine.json").write_text(json.dumps(engine, indent=2))
    print(json.dumps(engine, indent=2))
    return 0 if kernels.returncode == 0 and engine["ok"] else 1
