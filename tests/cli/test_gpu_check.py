"""The GPU check script's pieces that run anywhere: its batches and its SDPA baselines."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from batchgen.cli import gpu_kernels as gpu_check
from batchgen.cli.gpu_check import TRITON_TEST_FILES, GpuCheckOptions, run_gpu_check
from batchgen.cli.gpu_kernels import run_kernel_tests
from batchgen.kernels import paged_attention


@pytest.mark.parametrize(
    "shape",
    [
        gpu_check.Shape("decode", 3, 1, 40, 6, 2, 32),
        gpu_check.Shape("prefill", 2, 24, 0, 4, 2, 32),
        gpu_check.Shape("prefill", 2, 24, 17, 4, 2, 32),
    ],
    ids=lambda s: f"{s.kind}-ctx{s.context_len}",
)
def test_sdpa_baselines_match_the_paged_path(shape: gpu_check.Shape) -> None:
    # The benchmark compares Triton against these; they must compute the same attention.
    torch.manual_seed(0)
    query, k_cache, v_cache, meta, dense_k, dense_v = gpu_check.build_paged_batch(
        shape, torch.float32, torch.device("cpu")
    )
    scale = 1.0 / math.sqrt(shape.head_dim)
    expected = paged_attention(query, k_cache, v_cache, meta, scale, backend="torch")
    q = query.view(shape.num_seqs, shape.query_len, shape.num_heads, shape.head_dim).transpose(1, 2)
    candidates = gpu_check._sdpa_candidates(q, dense_k, dense_v, shape, scale)
    assert len(candidates) >= 2
    for _name, fn in candidates:
        out = fn().transpose(1, 2).reshape_as(expected)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_exits_with_message_without_cuda(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    interpret = os.environ.get("TRITON_INTERPRET")
    assert run_gpu_check(GpuCheckOptions(out_dir=tmp_path, num_prompts=1, max_tokens=1, max_num_seqs=1)) == 2
    captured = capsys.readouterr()
    assert "needs a CUDA GPU" in captured.err
    assert captured.out.startswith("gpu-check preflight\n")
    # Stopping for want of CUDA leaves the environment alone (this process's kernels are interpreted).
    assert os.environ.get("TRITON_INTERPRET") == interpret


def test_the_real_run_wires_its_stages_in_order_with_their_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # CUDA faked, every stage function replaced: what is under test is run_gpu_check's wiring.
    from batchgen.cli import gpu_check as check
    from batchgen.cli.gpu_preflight import StagePlan
    from batchgen.cli.gpu_stages import StageResult

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(check, "environment_facts", lambda interpret: {"cuda_available": True})
    monkeypatch.setattr(check, "format_preflight", lambda *args: "gpu-check preflight (stub)")
    monkeypatch.setattr(check, "_take_triton_interpret", lambda remove: None)
    monkeypatch.setattr(check, "_plans", lambda o: {n: StagePlan(n, n, (), needs_cuda=False) for n in o.selected_stages})
    calls: list[str] = []

    def fake(name: str, *, fail: bool = False) -> object:
        def run(*args: object) -> StageResult:
            calls.append(name)
            if fail:
                raise ImportError(f"No module named {name!r}")
            return StageResult(True, {"stage": name})

        return run

    monkeypatch.setattr(check, "_stage_kernels", fake("kernels"))
    monkeypatch.setattr(check, "_stage_kernel_tests", fake("kernel_tests"))
    monkeypatch.setattr(check, "_stage_model", fake("model", fail=True))
    monkeypatch.setattr(check, "_stage_engine", fake("engine"))
    monkeypatch.setattr(check, "_stage_bench", fake("bench"))
    monkeypatch.setattr(check, "_stage_attention", fake("attention"))
    assert run_gpu_check(GpuCheckOptions(out_dir=tmp_path)) == 1
    assert calls == ["kernels", "kernel_tests", "model", "attention"]
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    assert list(stages) == ["preflight", "kernels", "kernel_tests", "model", "engine", "bench", "attention"]
    assert stages["model"]["error"] == "ImportError: No module named 'model'"
    assert stages["engine"]["reason"] == stages["bench"]["reason"] == "needs stage(s) that did not end ok (model: failed)"
    assert stages["attention"]["status"] == "ok" and stages["attention"]["stage"] == "attention"
    calls.clear()
    assert run_gpu_check(GpuCheckOptions(out_dir=tmp_path / "two", stages=("kernels", "attention"))) == 0
    assert calls == ["kernels", "attention"]
    # The README's second try names engine and bench only: the model stage they need runs first.
    calls.clear()
    monkeypatch.setattr(check, "_stage_model", fake("model"))
    assert run_gpu_check(GpuCheckOptions(out_dir=tmp_path / "three", stages=("engine", "bench", "attention"))) == 0
    assert calls == ["model", "engine", "bench", "attention"]
    with pytest.raises(ValueError, match="unknown gpu-check stage"):
        GpuCheckOptions(out_dir=tmp_path, stages=("kernels", "warp"))


def test_kernel_tests_run_the_triton_files_and_report_their_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # On CPU with the interpreter off, the compiled Triton tests skip and the PyTorch-path ones run;
    # no compiler, so the CPU-kernel cases of these files skip rather than build it.
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = run_kernel_tests(tmp_path, TRITON_TEST_FILES, timeout_s=600)
    assert result["returncode"] == 0, (tmp_path / "pytest_kernels.log").read_text()[-3000:]
    assert result["timed_out"] is False and result["log"] == "pytest_kernels.log"
    assert result["counts"]["passed"] > 0 and result["counts"]["skipped"] > 0
    assert set(result["counts"]) <= {"passed", "skipped"}
    log = (tmp_path / "pytest_kernels.log").read_text()
    assert "test_triton_compile" not in log and "test_attention_cpu" not in log
    timed_out = run_kernel_tests(tmp_path, TRITON_TEST_FILES, timeout_s=0.5)
    assert timed_out["returncode"] is None and timed_out["timed_out"] is True
