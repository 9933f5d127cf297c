"""The model builds what its CPU backend needs when it is constructed, not in its first step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import batchgen.kernels.dispatch as dispatch
from batchgen.models.checkpoint import load_checkpoint
from batchgen.models.llama import LlamaModel
from tests.tiny_models import make_tiny_hf_folder


@pytest.mark.parametrize(("backend", "loads"), [("cpu", 1), ("torch", 0)])
def test_construction_loads_the_cpu_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, loads: int
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(dispatch, "load_cpu_kernel", lambda: calls.append(1))
    checkpoint = load_checkpoint(str(make_tiny_hf_folder(tmp_path / "m")))
    LlamaModel(
        checkpoint.config, checkpoint.weights, device=torch.device("cpu"), dtype=torch.float32,
        max_model_len=32, attention_backend=backend,  # type: ignore[arg-type]
    )  # fmt: skip
    assert len(calls) == loads


def test_an_explicit_cpu_backend_without_a_kernel_fails_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_compiler() -> None:
        raise RuntimeError("Error building extension: no c++")

    monkeypatch.setattr(dispatch, "load_cpu_kernel", no_compiler)
    checkpoint = load_checkpoint(str(make_tiny_hf_folder(tmp_path / "m")))
    with pytest.raises(RuntimeError, match="building extension"):
        LlamaModel(
            checkpoint.config, checkpoint.weights, device=torch.device("cpu"), dtype=torch.float32,
            max_model_len=32, attention_backend="cpu",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("backend", "dtype", "kernel_layout"),
    [(None, torch.float32, True), ("cpu", torch.float32, True), ("torch", torch.float32, False),
     (None, torch.bfloat16, False)],
)  # fmt: skip
def test_the_runner_lays_the_pool_out_for_the_backend_that_reads_it(
    tmp_path: Path, backend: str | None, dtype: torch.dtype, kernel_layout: bool
) -> None:
    """A CPU float32 model's pool must be in the compiled kernel's layout, or every step would
    silently take the PyTorch attention path (the automatic backend falls back on other layouts)."""
    from batchgen.engine.runner import ModelRunner
    from batchgen.kernels.attention_cpu import is_cpu_kernel_available, is_cpu_kv_layout

    if backend is None and dtype == torch.float32 and not is_cpu_kernel_available():
        pytest.skip("no C++ compiler for the CPU kernel")
    checkpoint = load_checkpoint(str(make_tiny_hf_folder(tmp_path / "m")))
    model = LlamaModel(
        checkpoint.config, checkpoint.weights, device=torch.device("cpu"), dtype=dtype,
        max_model_len=32, attention_backend=backend,  # type: ignore[arg-type]
    )  # fmt: skip
    runner = ModelRunner(model, num_blocks=5, block_size=16)
    c = checkpoint.config
    assert len(runner.kv_caches) == c.num_layers
    for k_cache, v_cache in runner.kv_caches:
        assert k_cache.shape == v_cache.shape == (5, 16, c.num_kv_heads, c.head_dim)
        assert k_cache.dtype == dtype and not k_cache.any()
        assert is_cpu_kv_layout(k_cache, v_cache) is kernel_layout
        assert k_cache.is_contiguous() is not kernel_layout
