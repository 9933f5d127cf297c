"""Loading the compiled CPU kernel survives a loader that was killed inside torch's `load()`."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.cpp_extension import _get_build_directory

from batchgen.kernels.attention_cpu import _extension_name, is_cpu_kernel_available, load_cpu_kernel

pytestmark = pytest.mark.skipif(not is_cpu_kernel_available(), reason="no C++ compiler for the CPU kernel")

ROOT = Path(__file__).resolve().parents[2]

# A process that takes torch's lock on the production build's folder, as `load()` does first,
# and is killed before it can remove it.
_KILLED_LOADER = """
import os, signal
from torch.utils.cpp_extension import _get_build_directory
from torch.utils.file_baton import FileBaton
from batchgen.kernels.attention_cpu import _extension_name
folder = _get_build_directory(_extension_name((), (), "batchgen_cpu_attention"), False)
baton = FileBaton(os.path.join(folder, "lock"))
assert baton.try_acquire()
print(os.path.join(folder, "lock"), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

_LOADER = """
from batchgen.kernels.attention_cpu import load_cpu_kernel
load_cpu_kernel()
print("loaded")
"""


def test_a_lock_left_by_a_killed_loader_does_not_stop_the_next_load() -> None:
    folder = Path(_get_build_directory(_extension_name((), (), "batchgen_cpu_attention"), False))
    # batchgen's own lock held meanwhile, so that no other test process clears the leftover first
    with open(folder / "batchgen.flock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        killed = subprocess.run(
            [sys.executable, "-c", _KILLED_LOADER], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        lock = folder / "lock"
        leftover = lock.exists()
    try:
        assert killed.returncode == -9, killed.stderr
        assert killed.stdout.strip() == str(lock) and leftover  # what torch alone would wait on forever
        # Before the fix this waited until the timeout.
        loaded = subprocess.run([sys.executable, "-c", _LOADER], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert loaded.returncode == 0, loaded.stderr
        assert loaded.stdout.strip() == "loaded"
        assert not lock.exists()
    finally:
        lock.unlink(missing_ok=True)  # a failure here must not hang every later load of the suite


def test_the_locked_folder_is_the_production_builds() -> None:
    # the folder the test above locks is the one load_cpu_kernel builds and loads
    assert load_cpu_kernel().__name__ == _extension_name((), (), "batchgen_cpu_attention")
