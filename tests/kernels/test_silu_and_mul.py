"""SiLU-and-multiply of a fused [gate | up] projection: the compiled CPU op against PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batchgen.kernels import silu_and_mul
from batchgen.kernels.attention_cpu import is_cpu_kernel_available

needs_kernel = pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")


def reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@needs_kernel
@pytest.mark.parametrize(("rows", "n"), [(1, 8), (3, 13), (37, 64), (5, 1536)])
def test_cpu_op_matches_pytorch(rows: int, n: int) -> None:
    x = torch.randn(rows, 2 * n, generator=torch.Generator().manual_seed(n)) * 4
    out = silu_and_mul(x, backend="cpu")
    assert out.shape == (rows, n) and out.dtype == torch.float32
    torch.testing.assert_close(out, reference(x), rtol=2e-6, atol=1e-6)


@needs_kernel
def test_cpu_op_at_the_ends_of_the_range() -> None:
    # exp(-|g|) underflows past |g| = 87: silu is then g (g > 0) or 0 (g < 0); 0 gives 0.
    g = torch.tensor([[-1e4, -100.0, -87.5, -20.0, -1e-30, 0.0, 1e-30, 20.0, 87.5, 100.0, 1e4, 3.0]])
    x = torch.cat([g, torch.full_like(g, 2.0)], dim=1)
    torch.testing.assert_close(silu_and_mul(x, backend="cpu"), reference(x), rtol=2e-6, atol=1e-30)


@needs_kernel
def test_default_backend_takes_the_cpu_op_for_float32_only() -> None:
    x = torch.randn(4, 32)
    torch.testing.assert_close(silu_and_mul(x), reference(x), rtol=2e-6, atol=1e-6)
    half = x.to(torch.bfloat16)
    assert torch.equal(silu_and_mul(half), reference(half))  # PyTorch path, bit for bit


def test_torch_backend_is_the_plain_ops() -> None:
    x = torch.randn(6, 10)
    assert torch.equal(silu_and_mul(x, backend="torch"), reference(x))
