"""gpu-check's model and engine pieces on CPU: the config round trip, weights drawn from a recipe
(seeded, loadable, reused), like-with-like comparisons with their timings and KV pool, and the
bench stage on a tiny model."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from batchgen.cli.gpu_bench_stage import BENCH_FILE, calibration_file, run_bench_stage
from batchgen.cli.gpu_engine_check import (
    DEFAULT_CANDIDATES,
    Candidate,
    EngineCheck,
    GreedyComparison,
    compare_greedy,
    run_engine_comparison,
)
from batchgen.cli.gpu_model import (
    RECIPE_FILE,
    WeightRecipe,
    hf_config_dict,
    materialize_model,
    write_model_recipe,
)
from batchgen.cli.main import main
from batchgen.data.workloads import BenchRequest, write_requests
from batchgen.models.checkpoint import expected_weight_shapes, load_checkpoint
from batchgen.models.config import ModelConfig
from batchgen.sim.calibrate import read_run
from batchgen.sim.hardware import load_hardware
from tests.tiny_models import make_tiny_hf_folder, smollm2_tokenizer


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    folder = make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)
    return ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text()))


def test_hf_config_round_trips_the_builtin_models_config() -> None:
    import gguf

    from batchgen.models.checkpoint import default_model_path
    from batchgen.models.gguf_loader import read_gguf_config

    reader = gguf.GGUFReader(default_model_path())
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    config = read_gguf_config(reader, default_model_path(), tokenizer_vocab_size=len(tokens))
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.num_layers) == (9, 3, 64, 30)
    assert ModelConfig.from_hf_dict(json.loads(json.dumps(hf_config_dict(config)))) == config


def test_weights_drawn_from_a_recipe_are_seeded_loadable_and_reused(tmp_path: Path, tiny_config: ModelConfig) -> None:
    folder = write_model_recipe(tmp_path / "recipe", tiny_config, smollm2_tokenizer(), WeightRecipe(seed=5))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", RECIPE_FILE, "tokenizer.json", "tokenizer_config.json"]
    first = materialize_model(folder, tmp_path / "work-a")
    second = materialize_model(folder, tmp_path / "work-b")
    assert first == tmp_path / "work-a" / "recipe-seed5-bfloat16" and not (folder / "model.safetensors").exists()
    # The same bytes (and so the same checkpoint fingerprint) from the same recipe, every time.
    assert _digest(first / "model.safetensors") == _digest(second / "model.safetensors")
    assert load_checkpoint(str(first)).fingerprint == load_checkpoint(str(second)).fingerprint
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert materialize_model(folder, tmp_path / "work-a") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not drawn again
    checkpoint = load_checkpoint(str(first))
    assert checkpoint.config == tiny_config
    assert {n: tuple(w.shape) for n, w in checkpoint.weights.items()} == expected_weight_shapes(tiny_config)
    assert checkpoint.tokenizer.encode("The capital of France is") == smollm2_tokenizer().encode("The capital of France is")
    assert materialize_model(first, tmp_path / "unused") == first  # a folder with weights is used as it is
    other = write_model_recipe(tmp_path / "other", tiny_config, smollm2_tokenizer(), WeightRecipe(seed=6))
    assert _digest(materialize_model(other, tmp_path / "work-a") / "model.safetensors") != _digest(first / "model.safetensors")


def test_a_folder_without_weights_or_recipe_and_a_bad_recipe_are_refused(tmp_path: Path, tiny_config: ModelConfig) -> None:
    folder = write_model_recipe(tmp_path / "m", tiny_config, smollm2_tokenizer())
    (folder / RECIPE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor a weight recipe"):
        materialize_model(folder, tmp_path / "work")
    (folder / RECIPE_FILE).write_text('{"seed": -1}')
    with pytest.raises(ValueError, match=f"{RECIPE_FILE}: not a weight recipe .*seed must be an int >= 0"):
        materialize_model(folder, tmp_path / "work")


def test_default_candidates_compare_like_with_like() -> None:
    gating = [c for c in DEFAULT_CANDIDATES if c.is_gating]
    assert [(c.attention_backend, c.dtype, c.reference) for c in gating] == [
        ("triton", "bfloat16", "bfloat16"),
        ("triton", "float32", "float32"),
    ]
    info = [c for c in DEFAULT_CANDIDATES if not c.is_gating]
    assert [(c.dtype, c.reference) for c in info] == [("bfloat16", "float32")]


def _comparison(ok: bool) -> GreedyComparison:
    return compare_greedy([[1, 2]], [[1, 3]], lambda i, p: 0.0 if ok else 9.0, max_gap=1.0)


def test_only_gating_comparisons_decide() -> None:
    comparisons = {"bf16": _comparison(True), "bf16-vs-fp32": _comparison(False)}
    drift = {"bf16": 0.0, "bf16-vs-fp32": 0.0}
    assert EngineCheck(comparisons, {}, {"bf16": True, "bf16-vs-fp32": False}, drift).ok is True
    assert EngineCheck(comparisons, {}, {"bf16": True, "bf16-vs-fp32": True}, drift).ok is False


def test_engine_comparison_runs_each_engine_once_on_the_capped_pool(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(tmp_path, num_heads=4, num_kv_heads=2, hidden_size=64)
    candidates = [
        Candidate("torch-bfloat16", "torch", "bfloat16", 0.0),
        Candidate("bf16-vs-fp32", "torch", "bfloat16", -1.0, reference_dtype="float32", is_gating=False),
    ]
    check = run_engine_comparison(
        str(folder), device="cpu", candidates=candidates, max_tokens=6, prompts=("The capital of France is", "1, 2, 3,"),
        num_kv_blocks=300, max_model_len=256,
    )
    assert sorted(check.timings) == ["torch-bfloat16", "torch-float32"]
    for timing in check.timings.values():
        assert timing.num_kv_blocks == 300 and timing.output_tokens == 12 and timing.num_steps >= 6
        # ms_per_step comes from the unrounded wall time; wall_s is rounded to 0.1 ms
        assert timing.ms_per_step == pytest.approx(1000 * timing.wall_s / timing.num_steps, abs=0.01)
    same = check.comparisons["torch-bfloat16"]
    assert same.num_identical == 2 and check.max_logprob_drift["torch-bfloat16"] == 0.0
    assert check.ok  # the information-only comparison cannot fail the check
    as_dict = check.as_dict()
    assert as_dict["comparisons"]["bf16-vs-fp32"]["is_gating"] is False
    assert set(as_dict["timings"]["torch-float32"]) == {f.name for f in dataclasses.fields(check.timings["torch-float32"])}


def test_bench_stage_runs_both_modes_and_writes_its_file(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(tmp_path, num_heads=4, num_kv_heads=2, hidden_size=64)
    requests = tmp_path / "requests.jsonl"
    write_requests(requests, [BenchRequest(f"r/{i}", tuple(range(1500, 1510 + i)), 5) for i in range(4)])
    result = run_bench_stage(
        str(folder), requests, out_dir=tmp_path / "out", work_dir=tmp_path / "work", num_prompts=3, max_tokens=5,
        max_num_seqs=2, max_num_batched_tokens=64, max_kv_blocks=64, max_model_len=128, device="cpu", dtype="float32",
    )
    assert result.ok
    figures = result.figures
    assert json.loads((tmp_path / "out" / BENCH_FILE).read_text()) == json.loads(json.dumps(figures))
    assert figures["num_requests"] == 3 and figures["prompt_tokens"] == 10 + 11 + 12
    assert sorted(figures["results"]) == ["continuous", "static"]
    for mode in figures["results"].values():
        assert mode["num_requests"] == 3 and 0 < mode["output_tokens"] <= 15
    replayed = (tmp_path / "work" / "bench_requests.jsonl").read_text().splitlines()
    assert [json.loads(line)["request_id"] for line in replayed] == ["r/0", "r/1", "r/2"]
    # Each mode's run as `bench --out` writes it: what `simulate --calibrate` fits a profile from.
    for mode, figures_of_mode in figures["results"].items():
        run = read_run(calibration_file(tmp_path / "out", mode))
        assert (run.model, run.device, run.dtype_bytes, run.num_kv_blocks) == (str(folder), "cpu", 4, 64)
        assert sum(w.num_steps for w in run.works) == figures_of_mode["num_steps"]
        assert sum(w.num_sampled for w in run.works) == figures_of_mode["output_tokens"]


def test_a_bench_stage_file_calibrates_where_its_model_folder_is_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The device's files come back without the device's model folder: its config.json (the
    # carried one) is enough to fit a profile.
    folder = make_tiny_hf_folder(tmp_path, num_heads=4, num_kv_heads=2, hidden_size=64)
    requests = tmp_path / "requests.jsonl"
    write_requests(requests, [BenchRequest(f"r/{i}", tuple(range(1500, 1520 + i)), 6) for i in range(6)])
    run_bench_stage(
        str(folder), requests, out_dir=tmp_path / "out", work_dir=tmp_path / "work", num_prompts=6, max_tokens=6,
        max_num_seqs=3, max_num_batched_tokens=64, max_kv_blocks=64, max_model_len=128, device="cpu", dtype="float32",
    )
    carried = tmp_path / "carried"
    carried.mkdir()
    shutil.copyfile(folder / "config.json", carried / "config.json")
    shutil.rmtree(folder)
    bench = str(calibration_file(tmp_path / "out", "continuous"))
    profile = tmp_path / "device.yaml"
    assert main(["simulate", "--calibrate", bench, "--out", str(profile)]) == 2
    assert "--model-config" in capsys.readouterr().err
    assert main(["simulate", "--calibrate", bench, "--model-config", str(carried / "config.json"),
                 "--out", str(profile)]) == 0
    fitted = load_hardware(str(profile))
    assert fitted.kv_committed_on_write is True and bench in fitted.description  # a CPU run, named
