"""Test-wide setup, done before anything imports torch or triton.

- TRITON_INTERPRET must be set before any module with @triton.jit is imported (unless a real GPU
  run asks otherwise), so it is set here, at the top of the first conftest pytest imports.
- One thread per process: the suite's subprocesses (CLI runs, kill/resume tests) inherit the
  environment, and on a 2-core machine several OpenMP pools oversubscribe the cores (the README's
  command runs one test process per core besides). Set here so that any `python -m pytest` is as
  fast as CI.
- No hub access: models come from tiny local folders and the packaged GGUF only.
"""

import os

if not os.environ.get("BATCHGEN_REAL_GPU"):
    os.environ["TRITON_INTERPRET"] = "1"
for _name, _value in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402 (after the environment above)

torch.set_num_threads(1)

from hypothesis import settings  # noqa: E402

# Property tests run the same examples on every run (CI must not flake on a new random example);
# HYPOTHESIS_PROFILE=explore searches new examples locally.
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests that load the built-in model or run a job in a subprocess must be marked slow (checked
# while they run: tests/slow_guard.py).
pytest_plugins = ("tests.slow_guard",)
