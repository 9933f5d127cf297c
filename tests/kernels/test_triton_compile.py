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
    # (dtype, group, head_dim, padded head_dim, block_m, ieee dots, window, soft cap), with the
    # launcher's tile shapes for the padded head_dim (paged_attention_triton).
    for dt, group, head_dim, padded, block_m, ieee, window, cap in [
        ("bf16", 3, 64, 64, 16, False, False, False),  # decode tile, 9 q / 3 kv heads
        ("bf16", 4, 128, 128, 64, False, False, False),  # prefill tile (wgmma)
        ("fp16", 32, 128, 128, 32, False, False, False),  # group larger than 16
        ("fp32", 4, 128, 128, 64, True, False, False),  # fp32 with ieee dots: the most shared memory
        ("bf16", 2, 256, 256, 32, False, True, True),  # Gemma 2: 256 lanes, window and soft cap
        ("fp32", 2, 256, 256, 32, True, True, True),  # the same in fp32 with ieee dots
        ("bf16", 8, 256, 256, 16, False, True, False),  # Gemma 3 decode: GQA 8, window
        ("bf16", 3, 96, 128, 64, False, False, False),  # Phi-3: 96 lanes padded to 128
    ]:
        wide = padded > 128
        pointers = {n: "*" + dt for n in ("out_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr")}
        pointers.update(block_tables_ptr="*i32", seq_lens_ptr="*i32", query_start_loc_ptr="*i32", qk_scale="fp32",
                        sm_scale="fp32", soft_cap="fp32")
        consts = dict(GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PADDED=padded, BLOCK_SIZE=16, BLOCK_M=block_m,
                      BLOCK_Q=block_m // group, TILE_N=16 if wide else triton_attention._TILE_N, DOT_F32=False,
                      DOT_IEEE=ieee, SLIDING_WINDOW=window, SOFT_CAP=cap, **unit)
        build(triton_attention._paged_attention_kernel, pointers, consts, num_warps=4, num_stages=1 if wide else 2)

    pointers = {n: "*bf16" for n in ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr")}
    pointers["slot_mapping_ptr"] = "*i64"
    build(triton_kv._write_kv_kernel, pointers,
          dict(NUM_KV_HEADS=3, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_HD=256), num_warps=4)
    pointers = {n: "*bf16" for n in ("out_ptr", "res_out_ptr", "x_ptr", "res_ptr", "w_ptr")}
    pointers["eps"] = "fp32"
    build(triton_norm_rope._rms_norm_kernel, pointers, dict(HAS_RESIDUAL=True, BLOCK=1024), num_warps=4)
    pointers = {"q_ptr": "*bf16", "k_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}
    for half, padded in ((32, 32), (48, 64)):  # SmolLM2; Phi-3 (head_dim 96)
        build(triton_norm_rope._rotary_kernel, pointers, dict(BLOCK_H=16, BLOCK_KV=4, HALF=half, HALF_PADDED=padded),
              num_warps=4)
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
