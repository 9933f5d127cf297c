"""tests/slow_guard.py catches unmarked tests that load the built-in model or run a job in a
subprocess, and leaves the rest alone: inner pytest runs over small test files, in a child
process (so that this process's own guard sees only `python -m pytest`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.job.helpers import subprocess_env
from tests.slow_guard import describe_job_subprocess

ROOT = Path(__file__).resolve().parents[1]

JOB_SUBPROCESSES = '''
import subprocess, sys
import pytest

FAKE_JOB = [sys.executable, "-c", "pass", "-m", "batchgen", "run", "job.yaml"]  # runs nothing

def test_unmarked_job_subprocess():
    subprocess.run(FAKE_JOB, check=True)

@pytest.mark.slow
def test_marked_job_subprocess():
    subprocess.run(FAKE_JOB, check=True)

def test_other_subprocess():
    subprocess.run([sys.executable, "-c", "print('run')"], check=True)

@pytest.fixture(scope="module")
def launched():
    subprocess.run(FAKE_JOB, check=True)

def test_first_user_of_a_job_fixture(launched):
    pass

def test_later_user_of_the_cached_fixture(launched):
    pass
'''

REAL_MODEL = '''
import pytest
from batchgen.models.checkpoint import default_model_path, load_checkpoint

def test_unmarked_real_model():
    load_checkpoint(None)

@pytest.mark.slow
def test_marked_real_model():
    load_checkpoint(None)

@pytest.fixture(scope="module")
def real():
    return load_checkpoint(default_model_path())

@pytest.mark.slow
def test_marked_first_user_of_a_real_model_fixture(real):
    pass

def test_unmarked_later_user_of_the_cached_fixture(real):
    pass

def test_tiny_gguf_and_the_real_tokenizer(tmp_path):
    from batchgen.models.checkpoint import load_checkpoint
    from tests.tiny_models import make_tiny_gguf, smollm2_tokenizer
    assert smollm2_tokenizer().vocab_size == 49152  # reads the built-in GGUF's tokenizer only
    load_checkpoint(make_tiny_gguf(tmp_path).gguf_path)


def test_unmarked_transformers_load():
    from transformers import AutoModelForCausalLM
    path = default_model_path()
    AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
'''


def _inner_run(tmp_path: Path, source: str) -> dict[str, str]:
    """Run `source` as a test file under the guard; outcome (and message) by test name."""
    (tmp_path / "test_inner.py").write_text(source)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.slow_guard", "-p", "no:cacheprovider", "-q", "-rA",
         "-W", "ignore::DeprecationWarning", "test_inner.py"],
        cwd=tmp_path, env={**subprocess_env(), "COLUMNS": "1000"}, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    outcomes = {}
    for line in proc.stdout.splitlines():
        match = re.match(r"(PASSED|FAILED|ERROR) test_inner\.py::(\w+)(?: - (.*))?$", line)
        if match:
            outcomes[match.group(2)] = match.group(1) + (f": {match.group(3)}" if match.group(3) else "")
    assert outcomes, proc.stdout + proc.stderr
    return outcomes


def test_jobs_in_subprocesses_need_the_marker(tmp_path: Path) -> None:
    got = _inner_run(tmp_path, JOB_SUBPROCESSES)
    assert got.pop("test_marked_job_subprocess") == "PASSED"
    assert got.pop("test_other_subprocess") == "PASSED"
    assert got.pop("test_unmarked_job_subprocess").startswith(
        "FAILED: Failed: test_inner.py::test_unmarked_job_subprocess is not marked slow, but it runs a job in a subprocess: "
    )
    assert got.pop("test_first_user_of_a_job_fixture").startswith("ERROR")
    later = got.pop("test_later_user_of_the_cached_fixture")
    assert later.startswith("ERROR") and "its fixture launched did: it runs a job in a subprocess" in later
    assert got == {}


@pytest.mark.slow  # the inner tests load the built-in model
def test_the_real_model_needs_the_marker(tmp_path: Path) -> None:
    got = _inner_run(tmp_path, REAL_MODEL)
    assert got.pop("test_marked_real_model") == "PASSED"
    assert got.pop("test_marked_first_user_of_a_real_model_fixture") == "PASSED"
    assert got.pop("test_tiny_gguf_and_the_real_tokenizer") == "PASSED"
    assert got.pop("test_unmarked_real_model") == (
        "FAILED: Failed: test_inner.py::test_unmarked_real_model is not marked slow, but it loads the built-in SmolLM2 model "
        "(seen in the test); mark it @pytest.mark.slow (README: -m 'not slow' leaves such tests out)"
    )
    later = got.pop("test_unmarked_later_user_of_the_cached_fixture")
    assert later.startswith("ERROR") and "its fixture real did: it loads the built-in SmolLM2 model" in later
    assert got.pop("test_unmarked_transformers_load").startswith("FAILED")
    assert got == {}


@pytest.mark.parametrize(
    ("args", "is_job"),
    [
        (["python", "-m", "batchgen", "run", "job.yaml"], True),
        (["python", "-m", "batchgen", "run-batch", "-i", "r.jsonl"], True),
        (["/venv/bin/batchgen", "run", "jobs/demo.yaml"], True),
        (["/venv/bin/batchgen", "prepare-sharegpt", "data"], False),
        (["python", "/repo/tests/job/helpers.py", "note", "write", "1", "run", "job.yaml"], True),
        (["python", "/repo/tests/ray/kill_driver.py", "note", "2", "run", "job.yaml"], True),
        (["python", "-c", "from batchgen.cli.main import main; main()", "run", "job.yaml"], True),
        (["python", "-c", "from batchgen.cli.main import main\nmain(['run', sys.argv[1]])", "job.yaml"], True),
        (["python", "-m", "batchgen", "report", "out"], False),
        (["python", "-c", "from batchgen.cli.main import main\nmain(['report', 'out'])"], False),
        (["python", "-c", "print('run')"], False),
        (["python", "-m", "pytest", "run"], False),
        ("python -m batchgen run", False),  # a shell string is one argument: no command found in it
    ],
)
def test_which_subprocesses_run_a_job(args: list[str] | str, is_job: bool) -> None:
    assert (describe_job_subprocess(args) is not None) == is_job
