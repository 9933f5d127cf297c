"""The mapped packages import from any working directory, the repository root included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = (
    "import batchgen, batchgen.radix, batchgen.io, batchgen.kernels, batchgen.models.llama, sys\n"
    "assert batchgen.radix.BlockPool and batchgen.io.ColumnMap and batchgen.kernels.paged_attention\n"
    "import importlib.util\n"
    "assert importlib.util.find_spec('batchgen.tests') is None, 'only radix, kernels and io are mapped'\n"
    "assert importlib.util.find_spec('batchgen.jobs') is None\n"
    "print(batchgen.radix.__file__)\n"
)


@pytest.mark.parametrize("where", ["root", "elsewhere"])
def test_imports_from_any_directory(where: str, tmp_path: Path) -> None:
    cwd = ROOT if where == "root" else tmp_path
    proc = subprocess.run([sys.executable, "-c", CODE], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("__init__.py")


def test_cli_entry_point_answers_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "batchgen", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0
    for command in ("run", "report", "bench", "prepare-sharegpt", "gpu-check"):
        assert command in proc.stdout


def test_a_non_editable_install_imports_every_layer(tmp_path: Path) -> None:
    # What users get from `pip install .`: the package-dir mapping of pyproject.toml, no checkout.
    target = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr
    # The CPU kernel compiles from its sources on the user's machine: all of them must ship.
    sources = sorted(p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".cpp", ".h"))
    assert len(sources) >= 3 and all((target / "batchgen" / "kernels" / name).is_file() for name in sources)
    code = (
        "import batchgen, batchgen.cli, batchgen.job, batchgen.engine, batchgen.models, batchgen.tokenizer, "
        "batchgen.data, batchgen.radix, batchgen.io, batchgen.kernels, importlib.util\n"
        "from batchgen.engine.llm_engine import LLMEngine\n"
        "from batchgen.job.run import run_job\n"
        "assert importlib.util.find_spec('batchgen.tests') is None\n"
        "print(batchgen.__file__, batchgen.io.__file__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(target / "batchgen" / "__init__.py"), str(target / "batchgen" / "io" / "__init__.py")]
