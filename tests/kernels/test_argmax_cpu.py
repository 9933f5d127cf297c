"""The compiled CPU argmax against torch.argmax: same index on ties, NaN and infinities."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import argmax
from batchgen.kernels.attention_cpu import argmax_cpu, is_cpu_kernel_available

pytestmark = pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")


def _rows() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 1000, generator=gen)  # not a multiple of 16: the scalar tail too
    x[1, [3, 700, 999]] = 50.0  # ties: the first wins
    x[2, 999] = 60.0  # the maximum in the tail
    x[3, [10, 500]] = float("nan")  # the first NaN wins, as in torch
    x[4, 998] = float("nan")  # a NaN only in the tail
    x[5] = float("-inf")  # every value -inf: index 0
    x[6, 42] = float("inf")
    x[7] = 1.0  # all equal
    x[8, 0] = 70.0  # the first element
    return x


def test_argmax_matches_torch_on_ties_nan_and_infinities() -> None:
    x = _rows()
    expected = torch.argmax(x, dim=-1)
    assert expected.tolist() == [expected[0].item(), 3, 999, 10, 998, 0, 42, 0, 0]
    assert torch.equal(argmax_cpu(x), expected)


@pytest.mark.parametrize("shape", [(1, 1), (3, 15), (2, 16), (64, 49152)])
def test_argmax_matches_torch_on_random_rows(shape: tuple[int, int]) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(argmax_cpu(x), torch.argmax(x, dim=-1))
    assert torch.equal(argmax(x), torch.argmax(x, dim=-1))


def test_dispatch_falls_back_for_other_dtypes() -> None:
    x = _rows()[:3].to(torch.float64)
    assert torch.equal(argmax(x), torch.argmax(x, dim=-1))


def test_dispatch_never_builds_the_kernel() -> None:
    """In a process that has not loaded the CPU kernel (a model on the "torch" backend), argmax
    takes torch's path rather than starting a build of half a minute."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import torch; from batchgen.kernels import argmax; "
        "from batchgen.kernels.attention_cpu import is_cpu_kernel_loaded; "
        "x = torch.randn(4, 100); assert torch.equal(argmax(x), x.argmax(-1)); "
        "assert not is_cpu_kernel_loaded()"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
