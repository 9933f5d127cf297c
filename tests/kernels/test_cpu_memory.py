"""A CPU model keeps freed heap memory, so that a step's large activations stop page-faulting.

Each case runs in a fresh process: the glibc setting is process-wide and sticky, and this
process has already built CPU models. The workload is a prefill step's MLP at 2048 tokens (the
25 MB gate/up output, allocated and freed in every layer); with glibc's defaults it takes
thousands of minor page faults per step (5.7-116k over the 12 measured steps: how many depends
on where address-space randomization puts the heap, so no test asserts a floor for it); after
keep_freed_memory only a new peak of the heap faults, once (with address-space randomization
fragmentation sometimes sets one or two new 12 MB peaks after the warm-up: 0-8k faults).
"""

from __future__ import annotations

import pathlib
import platform
import subprocess
import sys

import pytest

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings"
)

_STEPS = """
import resource, torch
torch.set_num_threads(1)
w_gate, w_down = torch.randn(3072, 576), torch.randn(576, 1536)
def step(tokens):
    x = torch.randn(tokens, 576)
    for _ in range(4):
        gate_up = x @ w_gate.T
        hidden = torch.nn.functional.silu(gate_up[:, :1536]) * gate_up[:, 1536:]
        del gate_up
        x = x + hidden @ w_down.T
for tokens in (2048, 1500, 2048, 1700, 2048, 1600):
    step(tokens)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for tokens in (2048, 1800, 2048, 1900) * 3:
    step(tokens)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

_BUILD_CPU_MODEL = """
import tempfile, pathlib, torch
from batchgen.models.checkpoint import load_checkpoint
from batchgen.models.llama import LlamaModel
from tests.tiny_models import make_tiny_hf_folder
folder = make_tiny_hf_folder(pathlib.Path(tempfile.mkdtemp()) / "m")
checkpoint = load_checkpoint(str(folder))
LlamaModel(checkpoint.config, checkpoint.weights, device=torch.device("cpu"), dtype=torch.float32,
           max_model_len=64, attention_backend="torch")
"""


def _faults(setup: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", setup + _STEPS], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip().splitlines()[-1])


def test_keep_freed_memory_stops_the_faults() -> None:
    setup = "from batchgen.kernels import keep_freed_memory\nassert keep_freed_memory()\n"
    assert _faults(setup) < 15000


def test_building_a_cpu_model_keeps_freed_memory() -> None:
    """Users get it without asking: constructing a CPU model (any backend) sets it."""
    assert _faults(_BUILD_CPU_MODEL) < 15000
