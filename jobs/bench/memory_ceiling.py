"""How fast this machine reads memory in the pattern in which decode attention reads the KV pool.

usage: PYTHONPATH=. python jobs/bench/memory_ceiling.py [--threads 2] [--gib 4]

A decode step reads each sequence's K/V blocks, which sit anywhere in the pool: per (block, KV
head) one 4 KB piece of K and one of V (SmolLM2's head_dim 64 x block_size 16 floats), at
random places in a pool of several GB. This prints the read rate of

- one sequential stream over the region (what the hardware prefetchers do best);
- 4 KB pieces in random order, alone and in pairs read together (a block's K and V piece, as
  the kernel reads them), and 12 and 24 KB pieces (a block's K for all three KV heads; K and V
  of a block side by side, layouts batchgen does not have), each with no software prefetch,
  with every line of the pieces 4 ahead asked into L2 in one burst, and with one line in 16
  asked (enough to start the hardware prefetcher and the page walk);

on `--threads` threads, each reading its own share of the pieces with a trivial sum (no other
work): what the attention kernel's K/V reads can be held against (`attention_kernel.py --cases
decode` prints its rate, with the arithmetic it does between the loads). Builds a small C++
loop with torch.utils.cpp_extension on first use.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

// Sums pieces of `piece` floats of `pool`, piece ids[i] starting at ids[i] * piece, split over
// the intra-op threads, `width` pieces at a time with their loads interleaved (2: a block's K and
// V piece, as the attention kernel reads them); with `stride` > 0, the pieces `ahead` groups on
// are asked into L2 (one prefetch every `stride` lines) before a group is read.
double read_pieces(torch::Tensor pool, torch::Tensor ids, int64_t piece, int64_t width, int64_t ahead, int64_t stride) {
  const float* p = pool.data_ptr<float>();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t groups = ids.numel() / width;
  std::vector<double> sums(at::get_num_threads(), 0.0);
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = begin; g < end; ++g) {
      if (stride > 0 && g + ahead < end) {
        for (int64_t w = 0; w < width; ++w) {
          const float* next = p + id[(g + ahead) * width + w] * piece;
          for (int64_t f = 0; f < piece; f += 16 * stride) _mm_prefetch(reinterpret_cast<const char*>(next + f), _MM_HINT_T1);
        }
      }
      const float* a = p + id[g * width] * piece;
      const float* b = p + id[g * width + width - 1] * piece;
      if (width == 1) {
        for (int64_t f = 0; f < piece; f += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(a + f));
      } else {
        for (int64_t f = 0; f < piece; f += 16) {
          acc = _mm512_add_ps(acc, _mm512_add_ps(_mm512_loadu_ps(a + f), _mm512_loadu_ps(b + f)));
        }
      }
    }
    sums[at::get_thread_num()] += _mm512_reduce_add_ps(acc);
  });
  double total = 0.0;
  for (double s : sums) total += s;
  return total;
}
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gib", type=float, default=4.0, help="size of the region read (default 4 GiB)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    module = load_inline(
        "batchgen_memory_ceiling", cpp_sources=_SOURCE, functions=["read_pieces"], extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"]
    )
    pool = torch.ones(int(args.gib * (1 << 28)))  # floats
    gen = torch.Generator().manual_seed(0)

    def rate(ids: torch.Tensor, piece: int, ahead: int, stride: int, width: int = 1) -> float:
        module.read_pieces(pool, ids[: 8 * args.threads], piece, width, ahead, stride)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            module.read_pieces(pool, ids, piece, width, ahead, stride)
            best = min(best, time.perf_counter() - start)
        return ids.numel() * piece * 4 / best / 1e9

    n = pool.numel() // 1024
    print(f"{args.threads} threads, {args.gib:g} GiB region")
    print(f"  sequential stream                 {rate(torch.arange(n), 1024, 0, 0):6.1f} GB/s")
    for kb, width in ((4, 1), (4, 2), (12, 1), (12, 2), (24, 1)):
        piece = kb * 256
        count = pool.numel() // piece
        ids = torch.randperm(count, generator=gen)[: count // 2]
        cells = [f"{rate(ids, piece, ahead, stride, width):5.1f}" for ahead, stride in ((0, 0), (4, 1), (4, 16))]
        what = f"{kb:>2} KB pieces" + (" in pairs" if width == 2 else "         ")
        print(f"  random {what}: no prefetch {cells[0]}, every line 4 ahead {cells[1]}, one line in 16 4 ahead {cells[2]} GB/s")


if __name__ == "__main__":
    main()
