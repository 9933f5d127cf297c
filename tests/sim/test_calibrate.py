"""Calibration recovers the coefficients that made a timeline, and reads runs as intervals."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.sim.calibrate import RunRecord, _intervals, calibrate, fit_profile
from batchgen.sim.cost import CostModel, ModelShape, StepWork
from batchgen.sim.hardware import HardwareProfile

SHAPE = ModelShape(num_layers=30, hidden_size=576, intermediate_size=1536, num_heads=9, num_kv_heads=3,
                   head_dim=64, vocab_size=49152, tie_word_embeddings=True)  # SmolLM2-135M


def _truth(step: float, seq: float, flops: float, bandwidth: float, attention: float | None = None) -> HardwareProfile:
    return HardwareProfile(name="truth", description="", peak_flops=flops, memory_bandwidth=bandwidth,
                           memory_bytes=1.0, compute_efficiency=1.0, memory_efficiency=1.0,
                           step_overhead_s=step, seq_overhead_s=seq, overlap=False, dtype_bytes=4,
                           attention_flops=attention)


def _works(rng: random.Random, n: int) -> list[StepWork]:
    works = []
    for _ in range(n):
        steps = rng.randint(1, 8)
        seqs = rng.randint(steps, 64 * steps)
        prefill = rng.choice([0, 0, rng.randint(16, 2048)])
        works.append(StepWork(steps, seqs, seqs + prefill, seqs, rng.randint(0, 400) * seqs, rng.randint(0, 400) * seqs + prefill**2 // 2))
    return works


@settings(max_examples=30)
@given(
    seed=st.integers(0, 10_000),
    step=st.sampled_from([0.0, 1e-4, 3e-3]),
    seq=st.sampled_from([0.0, 2e-6, 5e-5]),
    flops=st.sampled_from([1e10, 5e10, 3e11]),
    bandwidth=st.sampled_from([5e9, 2e10, 1e11]),
)
def test_a_timeline_made_by_a_profile_fits_back_to_it(seed: int, step: float, seq: float, flops: float,
                                                       bandwidth: float) -> None:
    truth = _truth(step, seq, flops, bandwidth)
    works = _works(random.Random(seed), 60)
    seconds = [CostModel(SHAPE, truth).seconds(w) for w in works]
    fit = fit_profile(works, seconds, SHAPE, dtype_bytes=4, kv_cache_bytes=None, name="fit")
    p = fit.profile
    assert p.step_overhead_s == pytest.approx(step, rel=1e-6, abs=1e-12)
    assert p.seq_overhead_s == pytest.approx(seq, rel=1e-6, abs=1e-12)
    assert p.peak_flops == pytest.approx(flops, rel=1e-6)
    assert p.memory_bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert p.attention_flops is None  # attention at the GEMMs' rate
    assert fit.r_squared == pytest.approx(1.0) and fit.predicted_s == pytest.approx(fit.measured_s)
    assert (p.overlap, p.compute_efficiency, p.memory_efficiency, p.kv_committed_on_write) == (False, 1.0, 1.0, True)


def test_noisy_times_fit_with_no_negative_coefficient() -> None:
    rng = random.Random(3)
    truth = _truth(2e-3, 0.0, 4e10, 1e10)
    works = _works(rng, 80)
    seconds = [CostModel(SHAPE, truth).seconds(w) * rng.uniform(0.8, 1.2) for w in works]
    fit = fit_profile(works, seconds, SHAPE, dtype_bytes=4, kv_cache_bytes=4096.0, name="noisy")
    p = fit.profile
    assert min(p.step_overhead_s, p.seq_overhead_s) >= 0 and p.peak_flops > 0 and p.memory_bandwidth > 0
    assert fit.predicted_s == pytest.approx(fit.measured_s, rel=0.05)
    assert p.kv_cache_bytes == 4096.0


def test_a_gpu_runs_profile_keeps_its_pool_up_front_and_names_its_device() -> None:
    truth = _truth(2e-3, 1e-5, 4e10, 1e10)
    works = _works(random.Random(5), 30)
    seconds = [CostModel(SHAPE, truth).seconds(w) for w in works]
    gpu = fit_profile(works, seconds, SHAPE, dtype_bytes=2, kv_cache_bytes=None, name="g", device="cuda:0",
                      source="out/bench_continuous.json").profile
    assert gpu.kv_committed_on_write is False
    assert gpu.description == "calibrated on a cuda:0 device from out/bench_continuous.json"
    cpu = fit_profile(works, seconds, SHAPE, dtype_bytes=2, kv_cache_bytes=None, name="c", device="cpu").profile
    assert cpu.kv_committed_on_write is True and cpu.description.startswith("calibrated on ")
    assert "device" not in cpu.description


def _row(run: int, t: float, dt: float, steps: int, step_s: float) -> dict[str, float | int]:
    return {"run_index": run, "t_start": t, "t_end": t + dt, "num_steps": steps, "step_s": step_s,
            "seqs_running": 2.0, "prefill_tokens": 10, "decode_tokens": 4, "output_tokens": 4,
            "context_tokens": 30, "attention_pairs": 70}


def test_an_interval_stands_for_the_time_to_the_next_ones_start() -> None:
    rows = [
        _row(0, 100.0, 0.8, 2, 0.7),    # next starts 1.0 later: 1.0
        _row(0, 101.0, 1.8, 2, 1.7),    # next starts 2.0 later: 2.0
        _row(0, 103.0, 0.4, 1, 0.4),    # last: its span 0.4 + the mean gap per step (0.15 and 0.15)
        {**_row(0, 103.6, 0.0, 0, 0.0)},  # rows without steps count for nothing
        _row(1, 500.0, 3.0, 3, 3.0),    # another run: alone, no gap known
    ]
    works, seconds = _intervals(rows)  # type: ignore[arg-type]
    assert seconds == pytest.approx([1.0, 2.0, 0.4 + 0.15, 3.0])
    assert works[0] == StepWork(2, 4, 14, 4, 30, 70)


def _decode_run(seqs: int, truth: HardwareProfile, source: str, model: str = "m", dtype_bytes: int = 4) -> RunRecord:
    """A run whose intervals are all decode steps `seqs` wide (one interval a step, contexts
    growing): its steps' fixed cost and per-token cost move together."""
    works = tuple(StepWork(1, seqs, seqs, seqs, seqs * (100 + 3 * i), seqs * (101 + 3 * i)) for i in range(40))
    seconds = tuple(CostModel(SHAPE, truth).seconds(w) for w in works)
    return RunRecord(works=works, seconds=seconds, model=model, dtype_bytes=dtype_bytes, num_kv_blocks=64,
                     block_size=16, source=Path(source))


def test_runs_of_two_batch_widths_fit_as_one_and_separate_the_fixed_cost() -> None:
    truth = _truth(1e-3, 0.0, 2e10, 1e30)
    narrow, wide = _decode_run(2, truth, "run2"), _decode_run(8, truth, "run8")
    fit = calibrate([narrow, wide], SHAPE, name="two")
    assert fit.num_intervals == 80 and fit.r_squared == pytest.approx(1.0)
    assert fit.profile.step_overhead_s == pytest.approx(1e-3, rel=1e-6)
    assert fit.profile.peak_flops == pytest.approx(2e10, rel=1e-6)
    assert fit.profile.description.endswith("from run2, run8")
    # the fitted profile prices a width neither run had
    other = StepWork(1, 32, 32, 32, 32 * 200, 32 * 201)
    assert CostModel(SHAPE, fit.profile).seconds(other) == pytest.approx(CostModel(SHAPE, truth).seconds(other), rel=1e-6)
    assert calibrate(narrow, SHAPE).num_intervals == calibrate([narrow], SHAPE).num_intervals == 40


@pytest.mark.parametrize(("model", "dtype_bytes"), [("other", 4), ("m", 2)])
def test_runs_of_other_models_or_dtypes_are_refused(model: str, dtype_bytes: int) -> None:
    truth = _truth(1e-3, 0.0, 2e10, 1e30)
    with pytest.raises(ValueError, match="one profile is fitted to one model's runs"):
        calibrate([_decode_run(2, truth, "a"), _decode_run(8, truth, "b", model, dtype_bytes)], SHAPE)
    with pytest.raises(ValueError, match="no runs"):
        calibrate([], SHAPE)
