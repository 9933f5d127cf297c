"""Test-wide setup: Triton runs under its interpreter unless a real GPU run asks otherwise.

TRITON_INTERPRET must be set before any module with @triton.jit is imported, so it is set here,
at the top of the first conftest pytest imports.
"""

import os

if not os.environ.get("BATCHGEN_REAL_GPU"):
    os.environ["TRITON_INTERPRET"] = "1"

import torch

torch.set_num_threads(1)
