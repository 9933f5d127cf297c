"""The CPU attention kernel alone, against the PyTorch path, at the engine's shapes.

usage: PYTHONPATH=. python jobs/bench/attention_kernel.py [--threads 2] [--cases decode prefill ...]
       [--kernels OTHER/kernels]

Cases (all by default):
- decode: 30 layers (one KV pool each) of one decode step at batch 64, 100-1,300 context tokens
  a sequence, blocks scattered through a 5,825-block pool as in a long run; prints ms per step
  and the K/V bytes read per second (the step is memory-bound: compare with the machine's
  streaming rate, printed too).
- multi_turn: the same batch shaped as multi-turn requests, whose tables share their leading
  blocks.
- prefill: chunks over a cached prefix, one layer; ms and GFLOP/s for the compiled kernel and
  the PyTorch path.
- window: the decode step and a prefill step with a 256-token sliding window against none (the
  kernel skips blocks outside the window), and with Gemma 2's soft cap of 50.
- head_dim: one layer of decode at batch 64 and of prefill at the shapes of 7B-class models
  (32 q / 8 KV heads, head_dim 128) and of Gemma (8 q / 4 KV heads, head_dim 256).
decode, multi_turn and prefill use SmolLM2-135M's shapes (9 q / 3 KV heads, head_dim 64).

--kernels imports the kernels package from another folder (another checkout's `kernels/`, e.g.
one written by `git archive`), so that runs before and after a change alternate in one session;
cases the other kernel does not take (windows before they existed) are skipped.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

NUM_BLOCKS, BLOCK, LAYERS = 5825, 16, 30
CASES = ("decode", "multi_turn", "prefill", "window", "head_dim")


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int


SMOLLM2 = Shape(9, 3, 64)


def _load_kernels(folder: str | None) -> ModuleType:
    """batchgen.kernels, or the package in `folder` imported under another name."""
    if folder is None:
        return importlib.import_module("batchgen.kernels")
    path = Path(folder).resolve()
    spec = importlib.util.spec_from_file_location("ab_kernels", path / "__init__.py", submodule_search_locations=[str(path)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ab_kernels"] = module
    spec.loader.exec_module(module)
    return module


class Bench:
    """The kernel module under test and the pools and metadata it runs on."""

    def __init__(self, kernels: ModuleType) -> None:
        self.cpu = importlib.import_module(kernels.__name__ + ".attention_cpu")
        self.torch_path = importlib.import_module(kernels.__name__ + ".attention_torch")
        self.metadata = importlib.import_module(kernels.__name__ + ".metadata")
        self.has_options = "sliding_window" in inspect.signature(self.cpu.paged_attention_cpu).parameters

    def meta(
        self, query_lens: list[int], seq_lens: list[int], gen: torch.Generator, num_blocks: int = NUM_BLOCKS
    ) -> object:
        """Each sequence gets its own blocks, drawn at random from the whole pool (of num_blocks)."""
        max_blocks = (max(seq_lens) + BLOCK - 1) // BLOCK
        perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
        tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
        used = 0
        for s, n in enumerate(seq_lens):
            count = (n + BLOCK - 1) // BLOCK
            tables[s, :count] = perm[used : used + count]
            used += count
        starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
        return self._meta(starts, seq_lens, tables, query_lens)

    def _meta(self, starts: torch.Tensor, seq_lens: list[int], tables: torch.Tensor, query_lens: list[int]) -> object:
        return self.metadata.AttentionMetadata(
            query_start_loc=starts,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=tables,
            slot_mapping=torch.zeros(sum(query_lens), dtype=torch.int64),
            query_lens_host=tuple(query_lens),
            seq_lens_host=tuple(seq_lens),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
        )

    def multi_turn_meta(self, gen: torch.Generator) -> tuple[object, int]:
        """64 decode rows, 16 conversations of 4 turns: turn k's table starts with turn k - 1's
        prompt blocks (its context less the 128 tokens it generated); returns it and the
        distinct blocks."""
        perm = iter(torch.randperm(NUM_BLOCKS, generator=gen).tolist())
        tables: list[list[int]] = []
        seq_lens: list[int] = []
        for _ in range(16):
            lens = sorted(torch.randint(300, 1300, (4,), generator=gen).tolist())
            previous: list[int] = []
            for k, n in enumerate(lens):
                shared = previous[: max(0, lens[k - 1] - 128) // BLOCK] if k else []
                table = shared + [next(perm) for _ in range((n + BLOCK - 1) // BLOCK - len(shared))]
                tables.append(table)
                seq_lens.append(n)
                previous = table
        width = max(len(t) for t in tables)
        padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        meta = self._meta(torch.arange(65, dtype=torch.int32), seq_lens, padded, [1] * 64)
        return meta, len({b for t in tables for b in t})

    def pool(self, shape: Shape, num_blocks: int = NUM_BLOCKS) -> tuple[torch.Tensor, torch.Tensor]:
        """Random K/V pools in the kernel's layout (the engine's: kernels.new_kv_cache)."""
        k_cache, v_cache = self.cpu.cpu_kv_cache(num_blocks, BLOCK, shape.kv_heads, shape.head_dim)
        k_cache.normal_()
        v_cache.normal_()
        return k_cache, v_cache


def _best_of(fn: Callable[[], object], repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _prefill_flop(num_seqs: int, chunk: int, context: int, shape: Shape, window: int | None = None) -> float:
    """q.k and p.v multiply-adds (x2 each) of the keys each query sees."""
    keys = sum(min(context + i + 1, window or context + i + 1) for i in range(chunk))
    return num_seqs * keys * shape.heads * shape.head_dim * 4


def _decode_cases(bench: Bench, cases: set[str], gen: torch.Generator) -> None:
    seq_lens = torch.randint(100, 1300, (64,), generator=gen).tolist()
    meta = bench.meta([1] * 64, seq_lens, gen)
    if not cases & {"decode", "multi_turn", "window"}:
        return
    pools = [bench.pool(SMOLLM2) for _ in range(LAYERS)]
    query = torch.randn(64, SMOLLM2.heads, SMOLLM2.head_dim)
    scale = SMOLLM2.head_dim**-0.5

    def step(meta: object, **options: object) -> Callable[[], None]:
        def run() -> None:
            for k_cache, v_cache in pools:
                bench.cpu.paged_attention_cpu(query, k_cache, v_cache, meta, scale, **options)

        return run

    gb = sum(seq_lens) * LAYERS * SMOLLM2.kv_heads * SMOLLM2.head_dim * 2 * 4 / 1e9
    if "decode" in cases:
        secs = _best_of(step(meta))
        print(
            f"decode, batch 64, {sum(seq_lens)} context tokens, {LAYERS} layers: kernel {secs * 1e3:.1f} ms "
            f"({gb:.2f} GB of K/V, {gb / secs:.1f} GB/s)"
        )
    if "multi_turn" in cases:
        # The same step as a multi-turn batch has it: 16 conversations of 4 requests, each request
        # the history so far, so request k shares its leading blocks (the previous request's
        # prompt) with request k - 1 in the pool.
        shared_meta, loaded = bench.multi_turn_meta(gen)
        shared_lens = list(shared_meta.seq_lens_host)  # type: ignore[attr-defined]
        secs = _best_of(step(shared_meta))
        blocks = sum((n + BLOCK - 1) // BLOCK for n in shared_lens)
        print(
            f"decode, batch 64, {sum(shared_lens)} context tokens in {blocks} blocks of which {loaded} distinct "
            f"(multi-turn sharing), {LAYERS} layers: kernel {secs * 1e3:.1f} ms"
        )
    if "window" in cases and bench.has_options:
        for options in ({"sliding_window": 256}, {"sliding_window": 256, "logits_soft_cap": 50.0}, {"logits_soft_cap": 50.0}):
            secs = _best_of(step(meta, **options))
            named = ", ".join(f"{k} {v}" for k, v in options.items())
            print(f"decode, batch 64, {sum(seq_lens)} context tokens, {LAYERS} layers, {named}: kernel {secs * 1e3:.1f} ms")


def _prefill_cases(bench: Bench, cases: set[str], gen: torch.Generator, kernel_only: bool) -> None:
    scale = SMOLLM2.head_dim**-0.5
    k_cache, v_cache = bench.pool(SMOLLM2)
    runs: list[tuple[int, int, int, dict[str, object]]] = []
    if "prefill" in cases:
        runs += [(8, 256, 600, {}), (4, 512, 100, {})]
    if "window" in cases and bench.has_options:
        runs += [(4, 512, 1000, {}), (4, 512, 1000, {"sliding_window": 256}), (4, 512, 1000, {"logits_soft_cap": 50.0})]
    for num_seqs, chunk, context, options in runs:
        pmeta = bench.meta([chunk] * num_seqs, [context + chunk] * num_seqs, gen)
        q = torch.randn(num_seqs * chunk, SMOLLM2.heads, SMOLLM2.head_dim)
        window = options.get("sliding_window")
        flop = _prefill_flop(num_seqs, chunk, context, SMOLLM2, window if isinstance(window, int) else None)
        named = "".join(f", {k} {v}" for k, v in options.items())
        paths = [("kernel", bench.cpu.paged_attention_cpu)]
        if not options and not kernel_only:
            paths.append(("torch", bench.torch_path.paged_attention_torch))
        for name, fn in paths:
            secs = _best_of(functools.partial(fn, q, k_cache, v_cache, pmeta, scale, **options))
            print(
                f"prefill {num_seqs} x {chunk} tokens over {context} cached{named}, one layer: "
                f"{name:<6} {secs * 1e3:6.1f} ms  {flop / secs / 1e9:5.1f} GFLOP/s"
            )


def _head_dim_cases(bench: Bench, gen: torch.Generator, kernel_only: bool) -> None:
    for shape in (Shape(32, 8, 128), Shape(8, 4, 256)):
        scale = shape.head_dim**-0.5
        seq_lens = torch.randint(100, 1300, (64,), generator=gen).tolist()
        num_blocks = min(sum((n + BLOCK - 1) // BLOCK for n in seq_lens) + 64, NUM_BLOCKS)
        k_cache, v_cache = bench.pool(shape, num_blocks)
        meta = bench.meta([1] * 64, seq_lens, gen, num_blocks)
        query = torch.randn(64, shape.heads, shape.head_dim)
        secs = _best_of(functools.partial(bench.cpu.paged_attention_cpu, query, k_cache, v_cache, meta, scale))
        gb = sum(seq_lens) * shape.kv_heads * shape.head_dim * 2 * 4 / 1e9
        print(
            f"decode, batch 64, {shape.heads}/{shape.kv_heads} heads, head_dim {shape.head_dim}, one layer: "
            f"kernel {secs * 1e3:.2f} ms ({gb / secs:.1f} GB/s)"
        )
        pmeta = bench.meta([256] * 4, [256 + 300] * 4, gen, num_blocks)
        q = torch.randn(4 * 256, shape.heads, shape.head_dim)
        flop = _prefill_flop(4, 256, 300, shape)
        paths = [("kernel", bench.cpu.paged_attention_cpu)]
        if not kernel_only:
            paths.append(("torch", bench.torch_path.paged_attention_torch))
        for name, fn in paths:
            secs = _best_of(functools.partial(fn, q, k_cache, v_cache, pmeta, scale))
            print(
                f"prefill 4 x 256 tokens over 300 cached, {shape.heads}/{shape.kv_heads} heads, head_dim "
                f"{shape.head_dim}, one layer: {name:<6} {secs * 1e3:6.1f} ms  {flop / secs / 1e9:5.1f} GFLOP/s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--kernels", help="import the kernels package from this folder instead of batchgen.kernels")
    parser.add_argument("--no-stream", action="store_true", help="skip the streaming-read figure")
    parser.add_argument("--kernel-only", action="store_true", help="skip the PyTorch path's prefill figures")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bench = Bench(_load_kernels(args.kernels))
    bench.cpu.load_cpu_kernel()  # the build (first time) outside the timings
    cases = set(args.cases)
    gen = torch.Generator().manual_seed(0)

    if not args.no_stream:
        stream = torch.randn(256 * 1024 * 1024)  # 1 GiB
        secs = _best_of(lambda: stream.sum())
        print(f"streaming read (torch sum over 1 GiB): {stream.numel() * 4 / secs / 1e9:.1f} GB/s")
        del stream
    _decode_cases(bench, cases, gen)
    if cases & {"prefill", "window"}:
        _prefill_cases(bench, cases, gen, args.kernel_only)
    if "head_dim" in cases:
        _head_dim_cases(bench, gen, args.kernel_only)


if __name__ == "__main__":
    main()
