import pytest

from batchgen.engine.step_arrays import build_step_arrays
from batchgen.engine.step_plan import ScheduledChunk


def test_mixed_decode_and_prefill_chunks_exact() -> None:
    chunks = [
        # decode: position 5 of a sequence with blocks [3, 7] (block size 4) -> slot 7*4 + 1
        ScheduledChunk(seq_id=11, token_ids=(42,), start_pos=5, block_table=(3, 7), num_samples=1),
        # prefill chunk starting mid-block, not reaching the end of its prompt: no sample
        ScheduledChunk(seq_id=12, token_ids=(1, 2, 3), start_pos=2, block_table=(0, 9), num_samples=0),
        # fresh prompt of 2 tokens, n=3 samples
        ScheduledChunk(seq_id=13, token_ids=(8, 9), start_pos=0, block_table=(5,), num_samples=3),
    ]
    a = build_step_arrays(chunks, block_size=4)
    assert a.input_ids == [42, 1, 2, 3, 8, 9]
    assert a.positions == [5, 2, 3, 4, 0, 1]
    assert a.slot_mapping == [29, 2, 3, 36, 20, 21]
    assert a.query_start_loc == [0, 1, 4, 6]
    assert a.query_lens == [1, 3, 2]
    assert a.seq_lens == [6, 5, 2]
    assert a.block_tables == [[3, 7], [0, 9], [5, 0]]
    assert a.logits_indices == [0, 5]
    assert a.sampling_seq_ids == [11, 13]


def test_block_boundary_positions() -> None:
    chunk = ScheduledChunk(seq_id=0, token_ids=tuple(range(8)), start_pos=0, block_table=(4, 2), num_samples=1)
    a = build_step_arrays([chunk], block_size=4)
    assert a.slot_mapping == [16, 17, 18, 19, 8, 9, 10, 11]
    assert a.logits_indices == [7]


def test_positions_past_table_raise() -> None:
    chunk = ScheduledChunk(seq_id=0, token_ids=(1, 2), start_pos=3, block_table=(0,), num_samples=1)
    with pytest.raises(ValueError, match="need more than 1 blocks"):
        build_step_arrays([chunk], block_size=4)


def test_empty_plan() -> None:
    a = build_step_arrays([], block_size=4)
    assert a.input_ids == [] and a.query_start_loc == [0] and a.block_tables == []
