"""The CPU attention kernel alone, against the PyTorch path, at the engine's shapes.

usage: PYTHONPATH=. python jobs/bench/attention_kernel.py [--threads 2]

decode: 30 layers (one KV pool each) of one decode step at batch 64, 100-1,300 context tokens a
sequence, blocks scattered through a 5,825-block pool as in a long run; prints ms per step and
the K/V bytes read per second (the step is memory-bound: compare with the machine's streaming
rate, printed too); then the same batch shaped as multi-turn requests, whose tables share their
leading blocks. prefill: chunks over a cached prefix, one layer; ms and GFLOP/s for the
compiled kernel and the PyTorch path.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from batchgen.kernels.attention_cpu import cpu_kv_cache, paged_attention_cpu
from batchgen.kernels.attention_torch import paged_attention_torch
from batchgen.kernels.metadata import AttentionMetadata

NUM_BLOCKS, BLOCK, KV_HEADS, HEADS, HEAD_DIM, LAYERS = 5825, 16, 3, 9, 64, 30


def _metadata(query_lens: list[int], seq_lens: list[int], gen: torch.Generator) -> AttentionMetadata:
    """Each sequence gets its own blocks, drawn at random from the whole pool."""
    max_blocks = (max(seq_lens) + BLOCK - 1) // BLOCK
    perm = torch.randperm(NUM_BLOCKS, generator=gen).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    used = 0
    for s, n in enumerate(seq_lens):
        count = (n + BLOCK - 1) // BLOCK
        tables[s, :count] = perm[used : used + count]
        used += count
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    return AttentionMetadata(
        query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.zeros(sum(query_lens), dtype=torch.int64),
        query_lens_host=tuple(query_lens),
        seq_lens_host=tuple(seq_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )


def _multi_turn_metadata(gen: torch.Generator) -> tuple[AttentionMetadata, int]:
    """64 decode rows, 16 conversations of 4 turns: turn k's table starts with turn k - 1's prompt
    blocks (its context less the 128 tokens it generated); returns it and the distinct blocks."""
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
    starts = torch.arange(65, dtype=torch.int32)
    meta = AttentionMetadata(
        query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.zeros(64, dtype=torch.int64),
        query_lens_host=(1,) * 64,
        seq_lens_host=tuple(seq_lens),
        max_query_len=1,
        max_seq_len=max(seq_lens),
    )
    return meta, len({b for t in tables for b in t})


def _pool() -> tuple[torch.Tensor, torch.Tensor]:
    """Random K/V pools in the kernel's layout (the engine's: kernels.new_kv_cache)."""
    k_cache, v_cache = cpu_kv_cache(NUM_BLOCKS, BLOCK, KV_HEADS, HEAD_DIM)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    scale = HEAD_DIM**-0.5

    stream = torch.randn(256 * 1024 * 1024)  # 1 GiB
    secs = _best_of(lambda: stream.sum())
    print(f"streaming read (torch sum over 1 GiB): {stream.numel() * 4 / secs / 1e9:.1f} GB/s")

    seq_lens = torch.randint(100, 1300, (64,), generator=gen).tolist()
    meta = _metadata([1] * 64, seq_lens, gen)
    pools = [_pool() for _ in range(LAYERS)]
    query = torch.randn(64, HEADS, HEAD_DIM)

    def decode_step() -> None:
        for k_cache, v_cache in pools:
            paged_attention_cpu(query, k_cache, v_cache, meta, scale)

    secs = _best_of(decode_step)
    gb = sum(seq_lens) * LAYERS * KV_HEADS * HEAD_DIM * 2 * 4 / 1e9
    print(
        f"decode, batch 64, {sum(seq_lens)} context tokens, {LAYERS} layers: kernel {secs * 1e3:.1f} ms "
        f"({gb:.2f} GB of K/V, {gb / secs:.1f} GB/s)"
    )

    # The same step as a multi-turn batch has it: 16 conversations of 4 requests, each request
    # the history so far, so request k shares its leading blocks (the previous request's prompt)
    # with request k - 1 in the pool.
    shared_meta, loaded = _multi_turn_metadata(gen)
    shared_lens = list(shared_meta.seq_lens_host)

    def shared_step() -> None:
        for k_cache, v_cache in pools:
            paged_attention_cpu(query, k_cache, v_cache, shared_meta, scale)

    secs = _best_of(shared_step)
    blocks = sum((n + BLOCK - 1) // BLOCK for n in shared_lens)
    print(
        f"decode, batch 64, {sum(shared_lens)} context tokens in {blocks} blocks of which {loaded} distinct "
        f"(multi-turn sharing), {LAYERS} layers: kernel {secs * 1e3:.1f} ms"
    )

    k_cache, v_cache = _pool()
    for num_seqs, chunk, context in ((8, 256, 600), (4, 512, 100)):
        pmeta = _metadata([chunk] * num_seqs, [context + chunk] * num_seqs, gen)
        q = torch.randn(num_seqs * chunk, HEADS, HEAD_DIM)
        flop = num_seqs * chunk * (context + (chunk + 1) / 2) * HEADS * HEAD_DIM * 4
        for name, fn in (("kernel", paged_attention_cpu), ("torch", paged_attention_torch)):
            secs = _best_of(lambda fn=fn, q=q, pmeta=pmeta: fn(q, k_cache, v_cache, pmeta, scale))
            print(
                f"prefill {num_seqs} x {chunk} tokens over {context} cached, one layer: "
                f"{name:<6} {secs * 1e3:6.1f} ms  {flop / secs / 1e9:5.1f} GFLOP/s"
            )


if __name__ == "__main__":
    main()
