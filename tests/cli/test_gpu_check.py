"""The GPU check script's pieces that run anywhere: its batches and its SDPA baselines."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from batchgen.cli import gpu_kernels as gpu_check
from batchgen.cli.gpu_check import GpuCheckOptions, run_gpu_check
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
