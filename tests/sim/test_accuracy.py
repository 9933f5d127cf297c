"""Prediction against measurement on a small case: calibrate on one run of a tiny model, predict
another configuration's run, measure it. Times are this process's CPU seconds (the lab's CPU
clock: steadier than wall time on a shared machine), and the bound is loose (a factor of 1.6)
because CI machines are noisy; the exact check of the simulator is test_step_sequence.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchgen.cli.bench import SimSpec, run_workload_bench
from batchgen.data.workloads import build_workload, write_requests
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.sim.calibrate import calibrate, read_run
from batchgen.sim.engine import load_sim_model
from batchgen.sim.hardware import load_hardware, write_hardware
from batchgen.sim.lengths import Filler, MaxTokens
from tests.tiny_models import make_tiny_hf_folder


def test_a_calibrated_profile_predicts_another_configurations_run(tmp_path: Path) -> None:
    model = make_tiny_hf_folder(tmp_path / "model", num_heads=4, num_kv_heads=2, hidden_size=64)
    sim_model = load_sim_model(str(model))
    requests = tmp_path / "requests.jsonl"
    write_requests(requests, build_workload("single-turn", sim_model.tokenizer, num_requests=24, max_tokens=12))

    def measure(max_num_seqs: int, out: Path | None = None, simulate: SimSpec | None = None) -> float:
        (result,) = run_workload_bench(
            model=str(model), workload="single-turn", num_requests=24, max_tokens=12,
            scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256),
            cache_config=CacheConfig(), runner_config=RunnerConfig(device="cpu"), requests_in=requests,
            use_tqdm=False, clock="cpu", ignore_eos=True, simulate=simulate, out=out,
        )
        return result.wall_s

    # A first run in a process pays one-time costs (kernel loading, allocator and thread-pool
    # warm-up) that no later run pays: calibrating on it fitted 2.2x the real cost per step
    # (CI: predicted 0.41 s against 0.18 s measured at 24 sequences). Warm up, then calibrate.
    measure(8)
    # Calibration runs of two batch widths (24 requests, 4 and 12 at a time). From one width alone
    # (8), whose steps are nearly all as wide, a step's fixed cost and its per-token cost cannot be
    # told apart: on a fast CPU the fit put most of the fixed cost on FLOPs and predicted 0.36-0.74
    # of the time measured at 2 sequences (one failure in seven runs).
    # Each run measured twice and the faster kept, for the calibration as for the check: a run that
    # meets the other test worker's load (memory and caches shared) takes more CPU time too (CI,
    # 2026-12-05: a calibration that predicted 0.097 s against 0.057 s measured at 24 sequences).
    def fastest(max_num_seqs: int, name: str) -> Path:
        runs = [tmp_path / f"{name}-{i}.json" for i in range(2)]
        seconds = [measure(max_num_seqs, run) for run in runs]
        return runs[seconds.index(min(seconds))]

    fit = calibrate([read_run(fastest(4, "cal4")), read_run(fastest(12, "cal12"))], sim_model.shape, name="ci")
    profile = write_hardware(tmp_path / "ci.yaml", fit.profile)
    spec = SimSpec(sim_model, load_hardware(str(profile)),
                   MaxTokens(Filler.for_tokenizer(sim_model.tokenizer, sim_model.config.eos_token_ids)))
    for max_num_seqs in (2, 24):  # more steps with fewer sequences each, and one wave of all
        predicted = measure(max_num_seqs, simulate=spec)
        measured = min(measure(max_num_seqs), measure(max_num_seqs))
        assert predicted == pytest.approx(measured, rel=0.6), (max_num_seqs, predicted, measured)
