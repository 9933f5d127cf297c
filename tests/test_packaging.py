"""The mapped packages import from any working directory, the repository root included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = (
    "import batchgen, batchgen.radix, batchgen.io, batchgen.kernels, batchgen.models.llama, sys\n"
    "assert batchgen.radix.BlockPool and batchgen.io.ColumnMap and batchgen.kernels.paged_attention\n"
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
