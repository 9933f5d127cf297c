"""A job steps its engine on one dedicated thread, and the thread that loaded the model gives up
its idle OpenMP workers: on the CPU, libgomp throttles every thread pool's spinning while its
pools hold more threads than there are CPUs, and steps taken from anyio's worker threads kept
one pool per thread (the demo job slept on a futex 153k times in its steps; 2k on one thread,
`/usr/bin/time -v batchgen run jobs/demo.yaml`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pyarrow as pa
import pytest

import batchgen
from batchgen.engine.llm_engine import LLMEngine
from batchgen.kernels.cpu_threads import _libgomps
from tests.tiny_models import make_tiny_hf_folder


def test_every_step_of_a_job_runs_on_one_engine_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_tiny_hf_folder(tmp_path / "model", num_heads=4, num_kv_heads=2, hidden_size=64)
    threads: list[threading.Thread] = []
    real_step = LLMEngine.step

    def step(self: LLMEngine) -> object:
        threads.append(threading.current_thread())
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", step)
    # Many small batches of rows, so reading and preparing interleave with the steps.
    table = pa.table({"prompt": [f"Item {i}: tell me about {'rivers' if i % 3 else 'hills'}" for i in range(48)]})
    result = batchgen.generate(
        table, model=str(model), sampling={"max_tokens": 6, "temperature": 0.0}, use_tqdm=False,
        device="cpu", max_model_len=128, max_num_seqs=4,
    )
    assert result.num_rows == 48
    assert len(threads) >= 48 * 6 // 4
    assert len(set(threads)) == 1, sorted({t.name for t in threads})
    assert threads[0].name.startswith("batchgen-engine")
    assert threads[0] is not threading.main_thread()


_COUNT_WORKERS = textwrap.dedent(
    """
    import os, torch
    from batchgen.kernels import release_openmp_threads
    torch.set_num_threads(2)
    count = lambda: len(os.listdir("/proc/self/task"))
    before = count()
    a = torch.randn(1024, 1024)
    a @ a  # starts this thread's OpenMP pool: one worker at two threads
    started = count()
    released = release_openmp_threads()
    print(before, started, released, count())
    """
)


@pytest.mark.skipif(not _libgomps(), reason="torch here does not use GNU OpenMP")
def test_release_openmp_threads_frees_the_callers_idle_workers() -> None:
    # A fresh process: the suite's own runs torch on one thread, which starts no pool.
    out = subprocess.run([sys.executable, "-c", _COUNT_WORKERS], capture_output=True, text=True, check=True)
    before, started, released, after = out.stdout.split()
    assert int(started) == int(before) + 1
    assert released == "True"
    assert int(after) == int(before)
