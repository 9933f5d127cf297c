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
