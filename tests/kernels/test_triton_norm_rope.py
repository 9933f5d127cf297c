"""RMSNorm (+ residual) and rotary embedding: Triton, compiled CPU and PyTorch paths against fp64
references (the CPU kernels take float32; other dtypes fall back to PyTorch there)."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import Backend, rms_norm, rotary_embedding
from batchgen.kernels.attention_cpu import is_cpu_kernel_available

from .attention_cases import CAN_RUN_TRITON, DEVICE, INTERPRETER_WARNING, IS_INTERPRETED

# Both backends round once to dtype from an fp32 result; allow a couple of ulps of the dtype.
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _no_cpu_kernels() -> bool:
    """Asked when a test is set up, not at collection: asking builds the C++ CPU kernel (half a
    minute on a fresh machine), which a run of only the Triton tests (gpu-check) must not pay."""
    return DEVICE.type != "cpu" or not is_cpu_kernel_available()


NEEDS_CPU_KERNELS = pytest.mark.skipif("_no_cpu_kernels()", reason="needs the compiled CPU kernels")
BACKENDS = [
    "torch",
    pytest.param("cpu", marks=NEEDS_CPU_KERNELS),
    pytest.param(
        "triton",
        marks=[
            pytest.mark.skipif(not CAN_RUN_TRITON, reason="needs CUDA or TRITON_INTERPRET=1"),
            pytest.mark.filterwarnings(INTERPRETER_WARNING),
        ],
    ),
]


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(
        actual.double().cpu(), expected.double().cpu(), atol=ATOL[dtype], rtol=RTOL[dtype]
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(backend: Backend, dtype: torch.dtype, with_residual: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    hidden = 96  # not a power of two, like SmolLM2's 576
    x = (torch.randn(5, hidden, generator=gen) * 3).to(dtype)
    residual = torch.randn(5, hidden, generator=gen).to(dtype) if with_residual else None
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    h = x if residual is None else x + residual  # rounded to dtype, like the model's add
    hd = h.double()
    expected = weight.double() * hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-6)

    result = rms_norm(
        x.to(DEVICE),
        weight.to(DEVICE),
        1e-6,
        None if residual is None else residual.to(DEVICE),
        backend=backend,
    )
    out, new_residual = result
    assert out.dtype == dtype and out.shape == x.shape
    if backend == "triton" and IS_INTERPRETED and dtype == torch.bfloat16:
        # The triton 3.6 interpreter casts fp32 -> bf16 by truncation (the GPU rounds to nearest
        # even), so the rounded sum may sit one bf16 ulp lower in magnitude.
        torch.testing.assert_close(new_residual.cpu(), h, atol=0, rtol=2**-7)
    else:
        assert torch.equal(new_residual.cpu(), h)
    _close(out, expected, dtype)


def _cos_sin(max_positions: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
    return freqs.cos(), freqs.sin()


def _rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face apply_rotary_pos_emb in fp64: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    cos_full = torch.cat((cos, cos), dim=-1)[:, None, :]
    sin_full = torch.cat((sin, sin), dim=-1)[:, None, :]
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x.double() * cos_full + rotated.double() * sin_full


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [32, 96])  # 96: Phi-3's, a half of 48 (no power of two)
def test_rotary_embedding_in_place_on_qkv_views(backend: Backend, dtype: torch.dtype, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(4)
    num_tokens, num_heads, num_kv_heads = 6, 6, 2
    cos64, sin64 = _cos_sin(64, head_dim)
    positions = torch.tensor([0, 1, 7, 8, 40, 63])
    # q, k, v as views into one fused projection output; v must stay untouched.
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, generator=gen).to(dtype)
    q_ref = _rotate_reference(qkv[:, :num_heads], cos64[positions], sin64[positions])
    k_ref = _rotate_reference(
        qkv[:, num_heads : num_heads + num_kv_heads], cos64[positions], sin64[positions]
    )
    v_before = qkv[:, num_heads + num_kv_heads :].clone()

    qkv_dev = qkv.to(DEVICE)
    query = qkv_dev[:, :num_heads]
    key = qkv_dev[:, num_heads : num_heads + num_kv_heads]
    rotary_embedding(
        positions.to(DEVICE),
        query,
        key,
        cos64.float().to(DEVICE),
        sin64.float().to(DEVICE),
        backend=backend,
    )
    _close(qkv_dev[:, :num_heads], q_ref, dtype)
    _close(qkv_dev[:, num_heads : num_heads + num_kv_heads], k_ref, dtype)
    assert torch.equal(qkv_dev[:, num_heads + num_kv_heads :].cpu(), v_before)


@NEEDS_CPU_KERNELS
def test_cpu_rotary_is_bit_identical_to_the_torch_path() -> None:
    """The compiled rotary rounds exactly as the PyTorch ops do (no FMA contraction)."""
    gen = torch.Generator().manual_seed(5)
    cos64, sin64 = _cos_sin(2048, 64)
    positions = torch.randint(0, 2048, (33,), generator=gen)
    qkv = torch.randn(33, 9 + 2 * 3, 64, generator=gen)
    copies = {}
    for backend in ("torch", "cpu"):
        x = qkv.clone()
        rotary_embedding(positions, x[:, :9], x[:, 9:12], cos64.float(), sin64.float(), backend=backend)
        copies[backend] = x
    assert not torch.equal(copies["cpu"], qkv)
    assert torch.equal(copies["cpu"], copies["torch"])
