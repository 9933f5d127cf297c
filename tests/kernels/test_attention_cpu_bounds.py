"""The compiled CPU attention kernel refuses metadata that would read outside its pools (issue 20).

The engine builds the metadata itself, so these never happen today; the checks turn a future bug
into a RuntimeError naming the sequence instead of a read of another sequence's (or no one's)
memory. Only what a sequence reads is checked: block-table padding past its blocks is free.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from batchgen.kernels import AttentionMetadata, paged_attention
from batchgen.kernels.attention_cpu import is_cpu_kernel_available

from .attention_cases import Batch, in_cpu_layout, make_batch, max_error, naive_attention

pytestmark = pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")

# Decode rows (one on a block boundary) beside prefill chunks over a prefix, so that both the
# decode slices and the per-sequence items see the metadata.
QUERY_LENS = (1, 1, 5, 20, 1)
CONTEXT_LENS = (20, 31, 16, 0, 47)
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def batch() -> Batch:
    return in_cpu_layout(make_batch(
        QUERY_LENS, CONTEXT_LENS, num_heads=4, num_kv_heads=2, head_dim=32, block_size=BLOCK_SIZE,
        device=torch.device("cpu"),
    ))  # fmt: skip


def _run(batch: Batch, meta: AttentionMetadata) -> torch.Tensor:
    out: torch.Tensor = paged_attention(batch.query, batch.k_cache, batch.v_cache, meta, batch.scale, backend="cpu")
    return out


def _with(meta: AttentionMetadata, **tensors: list[int] | list[list[int]]) -> AttentionMetadata:
    return dataclasses.replace(meta, **{k: torch.tensor(v, dtype=torch.int32) for k, v in tensors.items()})


def _blocks_read(seq_len: int) -> int:
    return -(-seq_len // BLOCK_SIZE)


def test_valid_metadata_runs(batch: Batch) -> None:
    assert max_error(_run(batch, batch.meta), naive_attention(batch)) < 2e-5


@pytest.mark.parametrize("seq", range(len(QUERY_LENS)))
@pytest.mark.parametrize("which", ["first", "last"])
@pytest.mark.parametrize("bad", ["num_blocks", "negative"])
def test_a_block_id_outside_the_pool_is_refused(batch: Batch, seq: int, which: str, bad: str) -> None:
    num_blocks = batch.k_cache.shape[0]
    value = num_blocks if bad == "num_blocks" else -1
    tables = batch.meta.block_tables.clone()
    idx = 0 if which == "first" else _blocks_read(batch.meta.seq_lens_host[seq]) - 1
    tables[seq, idx] = value
    meta = dataclasses.replace(batch.meta, block_tables=tables)
    expected = f"sequence {seq} reads block id {value} (block index {idx}), outside the pool's {num_blocks} blocks"
    with pytest.raises(RuntimeError, match=re.escape(expected)):
        _run(batch, meta)


def test_padding_past_a_sequences_blocks_is_not_read(batch: Batch) -> None:
    tables = batch.meta.block_tables.clone()
    for seq, seq_len in enumerate(batch.meta.seq_lens_host):
        tables[seq, _blocks_read(seq_len) :] = -7  # never read: no check, no effect
    out = _run(batch, dataclasses.replace(batch.meta, block_tables=tables))
    assert torch.equal(out, _run(batch, batch.meta))


def test_a_decreasing_query_start_loc_is_refused(batch: Batch) -> None:
    # 0, 1, 2, 7, 27, 28 with sequence 2 ending before it starts: 0, 1, 8, 7, 27, 28.
    with pytest.raises(RuntimeError, match=re.escape("query_start_loc decreases at sequence 2 (8 then 7)")):
        _run(batch, _with(batch.meta, query_start_loc=[0, 1, 8, 7, 27, 28]))


def test_more_query_tokens_than_the_sequence_holds_is_refused(batch: Batch) -> None:
    seq_lens = list(batch.meta.seq_lens_host)
    seq_lens[3] = 19  # its chunk has 20 query tokens
    with pytest.raises(RuntimeError, match=re.escape("sequence 3 has 20 query tokens but a seq_len of 19")):
        _run(batch, _with(batch.meta, seq_lens=seq_lens))


def test_a_seq_len_past_its_block_table_is_refused(batch: Batch) -> None:
    width = batch.meta.block_tables.shape[1]
    seq_lens = list(batch.meta.seq_lens_host)
    seq_lens[4] = width * BLOCK_SIZE + 1
    expected = f"sequence 4 has seq_len {width * BLOCK_SIZE + 1}, more than its block table's {width} blocks"
    with pytest.raises(RuntimeError, match=re.escape(expected)):
        _run(batch, _with(batch.meta, seq_lens=seq_lens))


@pytest.mark.parametrize(("starts", "span"), [([0, 1, 2, 7, 27, 29], "0 to 29"), ([-1, 1, 2, 7, 27, 28], "-1 to 28")])
def test_query_start_loc_outside_the_query_is_refused(batch: Batch, starts: list[int], span: str) -> None:
    with pytest.raises(RuntimeError, match=re.escape(f"query_start_loc spans tokens {span}, outside the query's 28 tokens")):
        _run(batch, _with(batch.meta, query_start_loc=starts))


@pytest.mark.parametrize(
    "tensors",
    [
        {"query_start_loc": [0, 1, 2, 7, 27]},  # one entry short
        {"seq_lens": [21, 32, 21, 20]},  # one sequence short
        {"block_tables": [[0, 1, 2, 3]]},  # one row for five sequences
    ],
)
def test_metadata_of_other_lengths_is_refused(batch: Batch, tensors: dict[str, list[int] | list[list[int]]]) -> None:
    with pytest.raises(RuntimeError, match=re.escape("for S sequences, seq_lens must be [S], query_start_loc [S + 1]")):
        _run(batch, _with(batch.meta, **tensors))


def test_a_query_of_another_head_dim_is_refused(batch: Batch) -> None:
    query = batch.query[:, :, :16].contiguous()
    with pytest.raises(RuntimeError, match=re.escape("with the pools' head_dim 32")):
        paged_attention(query, batch.k_cache, batch.v_cache, batch.meta, batch.scale, backend="cpu")


_INT32 = st.integers(-(2**31), 2**31 - 1)


@given(seq=st.integers(0, len(QUERY_LENS) - 1), position=st.floats(0, 1, exclude_max=True), value=_INT32)
def test_any_block_id_a_sequence_reads_is_checked(batch: Batch, seq: int, position: float, value: int) -> None:
    """Whatever int32 a block a sequence reads holds: outside [0, num_blocks) raises naming that
    sequence and the value; inside, the kernel agrees with the reference on that table."""
    num_blocks = batch.k_cache.shape[0]
    idx = int(position * _blocks_read(batch.meta.seq_lens_host[seq]))
    tables = batch.meta.block_tables.clone()
    tables[seq, idx] = value
    meta = dataclasses.replace(batch.meta, block_tables=tables)
    event("inside the pool" if 0 <= value < num_blocks else "outside the pool")
    if 0 <= value < num_blocks:
        corrupted = dataclasses.replace(batch, meta=meta)
        assert max_error(_run(batch, meta), naive_attention(corrupted)) < 2e-5
    else:
        with pytest.raises(RuntimeError, match=re.escape(f"sequence {seq} reads block id {value} (block index {idx})")):
            _run(batch, meta)
