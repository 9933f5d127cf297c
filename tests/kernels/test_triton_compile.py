"""The Triton kernels compile for Hopper (sm_90) without a GPU: code generation and ptxas.

The interpreter never lowers a kernel, so type errors in loop-carried values, illegal tl.dot
shapes or shared-memory overflows would only show on a GPU. triton.compile with an explicit
target needs no driver, only the ptxas that ships in the triton wheel. It runs in a subprocess
because the kernels must be imported with TRITON_INTERPRET unset.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

_SCRIPT = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from batchgen.kernels import triton_attention, triton_kv, triton_norm_rope

    TARGET = GPUTarget("cuda", 90, 32)
    SMEM_LIMIT = 227 * 1024


    def build(fn, pointers, constexprs, **options):
        sig = {n: "constexpr" if n in constexprs else pointers.get(n, "i32") for n in fn.arg_names}
        kernel = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=TARGET, options=options)
        assert kernel.metadata.shared <= SMEM_LIMIT, (fn.__name__, kernel.metadata.shared)
        return kernel


    unit = {"stride_qd": 1, "stride_od": 1, "stride_kd": 1, "stride_vd": 1}
    for dt, group, head_dim, block_m, ieee in [
        ("bf16", 3, 64, 16, False),  # decode tile, 9 q / 3 kv heads
        ("bf16", 4, 128, 64, False),  # prefill tile (wgmma)
        ("fp16", 32, 128, 32, False),  # group larger than 16
        ("fp32", 4, 128, 64, True),  # fp32 with ieee dots: the largest shared-memory use
    ]:
        pointers = {n: "*" + dt for n in ("out_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr")}
        pointers.update(block_tables_ptr="*i32", seq_lens_ptr="*i32", query_start_loc_ptr="*i32", qk_scale="fp32")
        consts = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=16, BLOCK_M=block_m,
                      BLOCK_Q=block_m // group, TILE_N=triton_attention._TILE_N, DOT_F32=False,
                      DOT_IEEE=ieee, **unit)
        build(triton_attention._paged_attention_kernel, pointers, consts, num_warps=4, num_stages=2)

    pointers = {n: "*bf16" for n in ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr")}
    pointers["slot_mapping_ptr"] = "*i64"
    build(triton_kv._write_kv_kernel, pointers,
          dict(NUM_KV_HEADS=3, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_HD=256), num_warps=4)
    pointers = {n: "*bf16" for n in ("out_ptr", "res_out_ptr", "x_ptr", "res_ptr", "w_ptr")}
    pointers["eps"] = "fp32"
    build(triton_norm_rope._rms_norm_kernel, pointers, dict(HAS_RESIDUAL=True, BLOCK=1024), num_warps=4)
    pointers = {"q_ptr": "*bf16", "k_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}
    build(triton_norm_rope._rotary_kernel, pointers, dict(BLOCK_H=16, BLOCK_KV=4, HALF=32), num_warps=4)
    print("compiled")
    """
)


def test_kernels_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("compiled")
