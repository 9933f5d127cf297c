"""gpu-check's kernel stage on CPU: the Triton attention kernel's specialisation (no recompiles as
the block-table width and the sequence count change), the per-kernel check at tiny sizes under
the interpreter, and the recompile probe's calls."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from batchgen.cli.gpu_kernel_check import KernelSizes, check_kernels, recompile_probe

pytest.importorskip("triton")

# Triton's binder (what `kernel[grid](...)` runs first) turns each argument into the part of the
# compile key it contributes; an int that is specialised contributes its value class (== 1,
# divisible by 16), so a new class means a new compile. Built for sm_90 without a driver.
_SPECIALISATION = textwrap.dedent(
    """
    import json
    import torch
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import create_function_from_signature

    from batchgen.kernels import triton_attention

    kernel = triton_attention._paged_attention_kernel
    backend = backends["nvidia"].compiler(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    pointer = torch.empty(4, dtype=torch.int32)

    def key(name, value):
        args = {n: (pointer if n.endswith("_ptr") else 1) for n in kernel.arg_names}
        args.update(qk_scale=0.5, GROUP=3, HEAD_DIM=64, BLOCK_SIZE=16, BLOCK_M=16, BLOCK_Q=5, TILE_N=32,
                    DOT_F32=False, DOT_IEEE=False)
        args[name] = value
        _, specialization, _ = binder(**args)
        return repr(specialization[kernel.arg_names.index(name)])

    print(json.dumps({n: [key(n, v) for v in (1, 16, 17, 32, 33)] for n in ("stride_bt", "num_seqs", "stride_qt")}))
    """
)


def test_block_table_width_and_sequence_count_do_not_specialise() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _SPECIALISATION], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    keys = json.loads(proc.stdout)
    assert keys["stride_bt"] == ["('i32', None)"] * 5
    assert keys["num_seqs"] == ["('i32', None)"] * 5
    # The probe sees specialisation where it exists: a query stride of 1 is a compile-time constant.
    assert keys["stride_qt"] == ["('constexpr', 1)", "('i32', 'D')", "('i32', '')", "('i32', 'D')", "('i32', '')"]


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
def test_every_kernel_case_runs_and_matches_the_torch_path_interpreted() -> None:
    cases = check_kernels(torch.device("cpu"), sizes=KernelSizes.tiny(), log=lambda _: None)
    assert [(c.kernel, c.dtype) for c in cases] == [
        (kernel, dtype)
        for dtype in ("bfloat16", "float32")
        for kernel in (
            "paged_attention decode 2x21",
            "paged_attention prefill 1x5 over 3",
            "write_kv 4 tokens",
            "rms_norm+residual 4x576",
            "rotary 4 tokens",
        )
    ]
    failed = [c for c in cases if not c.ok]
    assert failed == []
    assert all(c.warm_ms is None and c.first_call_s is not None for c in cases)  # no CUDA timing on CPU
    write_kv = [c for c in cases if c.kernel.startswith("write_kv")]
    assert [c.max_abs_err for c in write_kv] == [0.0, 0.0] and [c.tolerance for c in write_kv] == [0.0, 0.0]


def test_a_failing_kernel_case_is_recorded_and_the_others_run() -> None:
    # CUDA tensors on a machine without CUDA: every case fails where it builds its inputs.
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    cases = check_kernels(torch.device("cuda"), sizes=KernelSizes.tiny(), dtypes=(torch.float32,), log=lambda _: None)
    assert len(cases) == 5 and not any(c.ok for c in cases)
    assert all(c.error is not None and c.max_abs_err is None for c in cases)


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
def test_recompile_probe_walks_widths_and_counts() -> None:
    probe = recompile_probe(torch.device("cpu"), torch.float32)
    assert [(c["num_seqs"], c["block_table_width"]) for c in probe["calls"]] == [
        (3, 2), (1, 1), (16, 16), (17, 17), (5, 32), (5, 33), (32, 3)
    ]
    # Interpreted kernels keep no compile cache: nothing to count.
    assert probe["variants_added_after_first"] is None
