"""The model's projections alone: plain F.linear against weights packed by MKL, oneDNN and batchgen's kernel.

usage: PYTHONPATH=. python jobs/bench/linear_kernel.py [--rows 1 8 32 64 256 2048] [--threads 2]

One forward's projections of SmolLM2-135M (30 layers of qkv, o, gate_up and down; the 49k-row
lm_head too for decode-sized batches) at each row count, each layer with its own random weights
so that they come from memory as in a real step. Prints the best of four rounds, the
variants interleaved in each round, in ms per forward and GFLOP/s.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from batchgen.kernels.linear_cpu import (
    batchgen_linear_panel,
    linear,
    pack_linear_weight,
    packing_libraries,
)

LAYERS = 30
SHAPES = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 256, 2048])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    plain = {n: [torch.randn(*s, generator=gen) for _ in range(1 if n == "lm_head" else LAYERS)] for n, s in SHAPES.items()}
    variants: dict[str, dict[str, list]] = {"F.linear": plain}  # type: ignore[type-arg]
    for lib in (*packing_libraries(), *(("batchgen",) if batchgen_linear_panel() else ())):
        variants[lib] = {n: [pack_linear_weight(w, lib) for w in ws] for n, ws in plain.items()}
    for rows in args.rows:
        best = dict.fromkeys(variants, 0.0)
        flops = 0
        for name, (n, k) in SHAPES.items():
            if name == "lm_head" and rows > 64:
                continue  # prefill computes logits for a handful of rows, not all of them
            x = torch.randn(rows, k, generator=gen)
            flops += 2 * rows * n * k * len(plain[name])
            times: dict[str, float] = {}
            for _ in range(4):
                for v, weights in variants.items():
                    start = time.perf_counter()
                    for w in weights[name]:
                        linear(x, w) if v != "F.linear" else F.linear(x, w)
                    times[v] = min(times.get(v, 1e9), time.perf_counter() - start)
            for v in variants:
                best[v] += times[v]
        cells = "  ".join(f"{v} {t * 1e3:8.2f} ms {flops / t / 1e9:6.1f} GF/s" for v, t in best.items())
        print(f"rows {rows:5d}: {cells}", flush=True)


if __name__ == "__main__":
    main()
