"""The scheduling lab: latency records, Poisson arrivals, the sweep and its report (simulated,
so every time is exact), and the latency fields of a real bench run on a tiny model."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from batchgen.cli.bench import SimSpec, run_workload_bench
from batchgen.cli.bench_sweep import run_sweep
from batchgen.cli.lab import drive, lab_clock, latency_summary, poisson_arrivals, sweep_points
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig, engine_configs
from batchgen.engine.outputs import RequestMetrics
from batchgen.engine.sampling_params import SamplingParams
from batchgen.sim.engine import SimModel, build_sim_engine, load_sim_model
from batchgen.sim.hardware import HardwareProfile, load_hardware
from batchgen.sim.lengths import Filler, MaxTokens
from tests.report.helpers import assert_self_contained, images
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def model() -> SimModel:
    return load_sim_model(None)


@pytest.fixture(scope="module")
def spec(model: SimModel) -> SimSpec:
    filler = Filler.for_tokenizer(model.tokenizer, model.config.eos_token_ids)
    return SimSpec(model, load_hardware("h100-sxm"), MaxTokens(filler))


def test_latency_summary_on_exact_records() -> None:
    records = [
        RequestMetrics(arrival_time=0.0, first_scheduled_time=0.0, token_times=(1.0, 2.0, 4.0)),
        RequestMetrics(arrival_time=1.0, first_scheduled_time=3.0, token_times=(5.0,)),
    ]
    s = latency_summary(records)
    assert (s["queue_mean_s"], s["ttft_mean_s"], s["e2e_mean_s"]) == (1.0, 2.5, 4.0)
    assert (s["tbt_mean_s"], s["tbt_p50_s"]) == (1.5, 1.5)  # gaps 1 and 2 of the first request
    assert s["tpot_mean_s"] == 1.5  # the second request has one token: no gap
    assert s["queue_p99_s"] == pytest.approx(1.98)  # numpy's linear percentile of [0, 2]
    assert latency_summary([])["tbt_p99_s"] == 0.0


def test_poisson_arrivals_are_seeded_and_at_the_rate() -> None:
    a = poisson_arrivals(4000, 20.0)
    assert a == poisson_arrivals(4000, 20.0) and a is not None
    assert all(x < y for x, y in itertools.pairwise(a))
    assert a[-1] / len(a) == pytest.approx(1 / 20.0, rel=0.05)
    assert poisson_arrivals(5, None) is None and poisson_arrivals(5, float("inf")) is None
    with pytest.raises(ValueError):
        poisson_arrivals(5, 0.0)


def _sim_drive(model: SimModel, spec: SimSpec, rate: float | None, n: int = 12) -> tuple[list[RequestMetrics], HardwareProfile]:
    sim = build_sim_engine(model, engine_configs({"max_num_seqs": 4}), spec.hardware, spec.tokens)
    prompts = [[100 + i] * 40 for i in range(n)]
    params = [SamplingParams(max_tokens=16, ignore_eos=True, temperature=0)] * n
    run = drive(sim.engine, prompts, params, clock=lab_clock("sim", sim.clock), arrivals=poisson_arrivals(n, rate))
    return [run.metrics[i] for i in range(n)], spec.hardware


def test_requests_arriving_slowly_never_wait_and_fast_ones_queue(model: SimModel, spec: SimSpec) -> None:
    slow, _ = _sim_drive(model, spec, rate=0.5)  # one every 2 s: each finishes in ~0.1 s
    assert all(m.queue_s == 0.0 for m in slow)
    assert all(len(m.token_times) == 16 for m in slow)
    burst, _ = _sim_drive(model, spec, rate=None)  # all at once, 4 at a time
    assert sum(m.queue_s > 0 for m in burst) == 8 and max(m.queue_s for m in burst) > 0
    assert sorted(m.ttft_s for m in burst)[-1] > 2 * min(m.ttft_s for m in burst)


def test_the_cpu_clock_cannot_wait_for_arrivals(model: SimModel) -> None:
    with pytest.raises(ValueError, match="--clock wall"):
        lab_clock("cpu").wait_until(1e12)


def test_the_sweep_grid() -> None:
    points = sweep_points([8, 16], max_num_batched_tokens=512, cache=CacheConfig(block_size=32))
    assert [p.label for p in points[:4]] == ["continuous m=8", "no-chunked-prefill m=8", "no-prefix-cache m=8", "static m=8"]
    assert len(points) == 8 and {p.cache.block_size for p in points} == {32}
    by = {p.label: p for p in points}
    assert by["no-chunked-prefill m=16"].scheduler.enable_chunked_prefill is False
    assert by["no-prefix-cache m=16"].cache.enable_prefix_caching is False
    assert by["static m=16"].scheduler.batching == "static" and by["static m=16"].scheduler.max_num_seqs == 16


def test_a_simulated_sweep_writes_its_points_and_figures(spec: SimSpec, tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    points = run_sweep(model=None, workload="multi-turn", num_requests=24, max_tokens=32, max_num_seqs=[4, 8],
                       max_num_batched_tokens=256, cache_config=CacheConfig(), runner_config=RunnerConfig(),
                       ignore_eos=True, simulate=spec, out=out, use_tqdm=False)
    assert len(points) == 8
    by = {(p["policy"], p["max_num_seqs"]): p for p in points}
    for m in (4, 8):
        # multi-turn histories share prefixes: the cache saves prompt tokens; static waits for
        # a whole batch; one step's prompts are never cut without chunked prefill
        assert by[("no-prefix-cache", m)]["prefill_tokens_computed"] > by[("continuous", m)]["prefill_tokens_computed"]
        assert by[("static", m)]["num_steps"] > by[("continuous", m)]["num_steps"]
        assert by[("static", m)]["output_tokens_per_s"] < by[("continuous", m)]["output_tokens_per_s"]
        assert all(p["output_tokens"] == 24 * 32 for p in points)
    assert by[("continuous", 8)]["output_tokens_per_s"] > by[("continuous", 4)]["output_tokens_per_s"]
    saved = json.loads(out.read_text())
    assert saved["points"] == points and saved["settings"]["hardware"]["name"] == "h100-sxm"
    page = out.with_suffix(".html").read_text()
    assert_self_contained(page)
    assert len(images(page)) == 2 and "<h1>batchgen bench sweep (simulated)</h1>" in page
    # the figures plot the points: one line per policy, in max_num_seqs order
    from batchgen.report.sweep_figures import sweep_figures

    tbt, wait = sweep_figures(points)
    for policy in ("continuous", "no-chunked-prefill", "no-prefix-cache", "static"):
        line = tbt.get(policy)
        assert list(line.y) == [by[(policy, m)]["output_tokens_per_s"] for m in (4, 8)]
        assert list(line.x) == pytest.approx([by[(policy, m)]["tbt_p99_s"] * 1e3 for m in (4, 8)])
        assert list(wait.get(policy).x) == [by[(policy, m)]["queue_mean_s"] for m in (4, 8)]


def test_a_real_bench_run_records_latency_on_the_cpu_clock(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(tmp_path, num_heads=4, num_kv_heads=2, hidden_size=64)
    out = tmp_path / "bench.json"
    (result,) = run_workload_bench(
        model=str(folder), workload="single-turn", num_requests=6, max_tokens=5,
        scheduler_config=SchedulerConfig(max_num_seqs=2), cache_config=CacheConfig(),
        runner_config=RunnerConfig(device="cpu"), use_tqdm=False, clock="cpu", ignore_eos=True, out=out,
    )
    assert result.clock == "cpu" and result.output_tokens == 30 and result.request_rate is None
    assert 0 < result.ttft_mean_s <= result.e2e_mean_s <= result.wall_s
    assert result.queue_p99_s > 0  # 6 requests, 2 at a time
    assert result.tbt_p50_s > 0 and result.tpot_mean_s > 0
    saved = json.loads(out.read_text())
    assert saved["run"]["engine"]["num_kv_blocks"] > 0 and saved["results"][0]["ttft_mean_s"] == result.ttft_mean_s
    assert out.with_suffix(".timeline.parquet").is_file()


def test_bench_sampling_overrides_reach_every_request_and_the_sampler_is_timed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `bench --sampling` is how the penalties' cost is measured (issue 21): the fields must
    # reach the engine (a logit bias makes greedy pick token 5; the penalties then
    # pushes it down: a random tiny model never repeats a token by itself), and the time in the
    # sampler is reported beside the run's.
    from batchgen.cli.main import main

    folder = make_tiny_hf_folder(tmp_path, num_heads=4, num_kv_heads=2, hidden_size=64)

    def bench(*extra: str) -> dict[str, object]:
        out = tmp_path / f"bench{len(extra)}.json"
        argv = ["bench", "--model", str(folder), "--workload", "single-turn", "--num-prompts", "4",
                "--max-tokens", "12", "--ignore-eos", "--device", "cpu", "--quiet", "--out", str(out), *extra]
        assert main(argv) == 0
        result: dict[str, object] = json.loads(out.read_text())["results"][0]
        return result

    plain = bench()
    biased = bench("--sampling", "logit_bias={5: 50.0}")
    penalized = bench("--sampling", "logit_bias={5: 50.0}", "--sampling", "presence_penalty=2.0",
                      "--sampling", "frequency_penalty=2.0", "--sampling", "repetition_penalty=100")
    assert len({plain["output_digest"], biased["output_digest"], penalized["output_digest"]}) == 3
    assert 0 < float(str(penalized["sampler_s"])) < float(str(penalized["wall_s"]))
    assert "ms a step" in capsys.readouterr().out
    assert plain["masked_steps"] == 0
    constrained = bench("--sampling", "structured_outputs={regex: '[a-z]+'}")
    assert int(str(constrained["masked_steps"])) >= 12 and float(str(constrained["mask_fill_s"])) > 0
    assert "grammar masks: " in capsys.readouterr().out
    assert main(["bench", "--workload", "single-turn", "--sampling", "nope=1"]) == 2
    assert "expected FIELD=VALUE" in capsys.readouterr().err
