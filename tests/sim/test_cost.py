"""The cost model's formula on exact numbers, the built-in profiles, and the KV pool sizing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.step_plan import ScheduledChunk, StepPlan
from batchgen.sim.cost import CostModel, ModelShape, StepWork, kv_pool_blocks
from batchgen.sim.hardware import HardwareProfile, builtin_profiles, load_hardware, write_hardware

# Llama-3-8B's shapes (config.json of meta-llama/Meta-Llama-3-8B).
LLAMA_8B = ModelShape(num_layers=32, hidden_size=4096, intermediate_size=14336, num_heads=32,
                      num_kv_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False)


def profile(**changes: object) -> HardwareProfile:
    base: dict[str, object] = dict(
        name="unit", description="", peak_flops=1e12, memory_bandwidth=1e11, memory_bytes=1e10,
        compute_efficiency=0.5, memory_efficiency=0.5, step_overhead_s=0.001, seq_overhead_s=1e-5,
        overlap=True, dtype_bytes=2,
    )
    return HardwareProfile(**{**base, **changes})  # type: ignore[arg-type]


def test_llama_8b_shape_counts() -> None:
    # 6.98e9 layer parameters + 2 x 525M embeddings = the 8.03B of Llama-3-8B
    assert LLAMA_8B.body_params == 32 * (4096 * 128 * (2 * 32 + 2 * 8) + 3 * 4096 * 14336)
    assert LLAMA_8B.weight_bytes(2) == (LLAMA_8B.body_params + 2 * 4096 * 128256) * 2
    assert abs(LLAMA_8B.weight_bytes(2) / 2 - 8.03e9) < 0.01e9
    assert LLAMA_8B.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072


def test_work_of_a_plan_counts_tokens_pairs_and_context() -> None:
    plan = StepPlan(
        chunks=(
            ScheduledChunk(seq_id=1, token_ids=(5,), start_pos=9, block_table=(0,), num_samples=1),
            ScheduledChunk(seq_id=2, token_ids=(1, 2, 3), start_pos=4, block_table=(1,), num_samples=0),
            ScheduledChunk(seq_id=3, token_ids=(7, 8), start_pos=0, block_table=(2,), num_samples=2),
        ),
        block_copies=(),
    )
    # pairs: decode 9 + 1; chunk 3*4 + 3*4/2 = 18; prefill 0 + 2*3/2 = 3
    assert StepWork.of_plan(plan) == StepWork(num_steps=1, num_seqs=3, num_tokens=6, num_sampled=2,
                                              context_tokens=10 + 7 + 2, attention_pairs=10 + 18 + 3)


def test_the_formula_on_exact_numbers() -> None:
    shape = ModelShape(num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2, num_kv_heads=1,
                       head_dim=4, vocab_size=100, tie_word_embeddings=True)
    work = StepWork(num_steps=1, num_seqs=3, num_tokens=10, num_sampled=2, context_tokens=50, attention_pairs=70)
    body = 2 * (8 * 4 * (2 * 2 + 2 * 1) + 3 * 8 * 16)  # 960
    flops = 2 * body * 10 + 2 * 8 * 100 * 2
    attention = 4 * 2 * 2 * 4 * 70
    bytes_ = (body + 800) * 2 + (2 * 2 * 1 * 4 * 2) * (50 + 10)
    roof = CostModel(shape, profile())
    assert (roof.flops(work), roof.attention_flops(work), roof.bytes(work)) == (flops, attention, bytes_)
    cost = roof.cost(work)
    # without attention_flops, attention runs at the GEMMs' rate
    assert cost.compute_s == pytest.approx((flops + attention) / 0.5e12)
    assert cost.memory_s == pytest.approx(bytes_ / 0.5e11)
    assert cost.overhead_s == pytest.approx(0.001 + 3e-5)
    assert cost.total_s == pytest.approx(0.001 + 3e-5 + max(cost.compute_s, cost.memory_s))
    added = CostModel(shape, profile(overlap=False)).cost(work)
    assert added.total_s == pytest.approx(0.001 + 3e-5 + cost.compute_s + cost.memory_s)
    # with it, attention at its own rate (times the same compute efficiency)
    apart = CostModel(shape, profile(attention_flops=1e9)).cost(work)
    assert apart.compute_s == pytest.approx(flops / 0.5e12 + attention / 0.5e9)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 6), st.integers(0, 300), st.integers(0, 300)),
                min_size=1, max_size=8))
def test_added_costs_of_steps_equal_the_cost_of_their_sum(parts: list[tuple[int, int, int, int]]) -> None:
    # What calibration relies on: with overlap off, a timeline interval (the sum of its steps'
    # counts) costs the sum of its steps.
    model = CostModel(LLAMA_8B, profile(overlap=False))
    works = [StepWork(1, seqs, tokens, seqs, ctx, pairs) for seqs, tokens, ctx, pairs in
             ((s, t, c, p) for t, s, c, p in parts)]
    total = StepWork(len(works), *(sum(getattr(w, f) for w in works) for f in
                                   ("num_seqs", "num_tokens", "num_sampled", "context_tokens", "attention_pairs")))
    assert model.seconds(total) == pytest.approx(sum(model.seconds(w) for w in works), rel=1e-12)


def test_builtin_profiles_load_and_size_an_8b_pool() -> None:
    names = set(builtin_profiles())
    assert {"a100-80gb", "h100-sxm", "h200", "l4"} <= names
    h100 = load_hardware("h100-sxm")
    assert (h100.peak_flops, h100.memory_bandwidth, h100.dtype_bytes) == (989e12, 3.35e12, 2)
    # 80 GiB * 0.9 - 16.06 GB weights - 2 GiB reserve, in blocks of 16 tokens of 128 KiB each
    expected = int((80 * 2**30 * 0.9 - LLAMA_8B.weight_bytes(2) - 2 * 2**30) // (16 * 131072))
    assert kv_pool_blocks(h100, LLAMA_8B, 16) == expected == 28_182
    l4 = load_hardware("l4")
    assert kv_pool_blocks(l4, LLAMA_8B, 16) > 0
    seventy_b = ModelShape(80, 8192, 28672, 64, 8, 128, 128256, False)
    with pytest.raises(ValueError, match="leave no room"):
        kv_pool_blocks(l4, seventy_b, 16)


def test_a_profile_file_round_trips_and_bad_files_name_the_key(tmp_path: Path) -> None:
    p = profile(kv_cache_bytes=4096.0, name="mine")
    path = write_hardware(tmp_path / "p.yaml", p, comment="fitted\nhere")
    assert path.read_text().startswith("# fitted\n# here\n")
    assert load_hardware(str(path)) == p
    assert kv_pool_blocks(p, LLAMA_8B, 1) == 0  # a stated pool wins over memory
    (tmp_path / "bad.yaml").write_text(path.read_text() + "turbo: true\n")
    with pytest.raises(ValueError, match="unknown key.*turbo"):
        load_hardware(str(tmp_path / "bad.yaml"))
    (tmp_path / "neg.yaml").write_text(path.read_text().replace("compute_efficiency: 0.5", "compute_efficiency: 1.5"))
    with pytest.raises(ValueError, match="compute_efficiency must be in"):
        load_hardware(str(tmp_path / "neg.yaml"))
    with pytest.raises(FileNotFoundError, match="h100-sxm"):
        load_hardware("tpu-v9")
