"""`executor: ray` without Ray installed: a setup error (exit 2) that says how to install it.

Runs everywhere (no Ray needed): the subprocess hides Ray by putting None in sys.modules.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.job.helpers import make_prompt_shards, subprocess_env, write_job

ROOT = Path(__file__).resolve().parents[2]
_HIDE_RAY = "import sys; sys.modules['ray'] = None; from batchgen.cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.slow  # a job run in a subprocess
def test_without_ray_the_job_says_how_to_install_it(tmp_path: Path) -> None:
    make_prompt_shards(tmp_path / "in", num_shards=1, rows_per_shard=2)
    job = write_job(
        tmp_path / "job.yaml",
        {"input": {"path": "in"}, "output": {"path": "out"}, "executor": "ray"},
    )
    env = subprocess_env()
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-c", _HIDE_RAY, "run", str(job), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"error: {job}: executor: ray needs Ray, which is not installed" in result.stderr
    assert "pip install 'batchgen[ray]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # nothing planned, nothing written
