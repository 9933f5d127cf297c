"""batchgen.radix is pure Python: importing it must not import torch or another package of ours."""

from __future__ import annotations

import pathlib
import subprocess
import sys

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_import_radix_does_not_import_torch() -> None:
    code = (
        "import batchgen.radix, sys; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "ours = sorted(m for m in sys.modules if m.startswith('batchgen.') "
        "and not m.startswith('batchgen.radix')); "
        "assert not ours, ours"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
