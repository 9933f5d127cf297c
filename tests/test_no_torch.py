"""The pure layers import light: batchgen.radix is plain Python, batchgen.io needs only the stdlib
and pyarrow. Importing either (in a fresh process) must not import torch, polars or another
package of ours (batchgen/__init__.py and its private helpers batchgen._* load with any)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", ["batchgen.radix", "batchgen.io"])
def test_import_does_not_import_torch(package: str) -> None:
    code = (
        f"import {package}, sys; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'polars' not in sys.modules, 'polars imported eagerly'; "
        "ours = sorted(m for m in sys.modules if m.startswith('batchgen.') "
        f"and not m.startswith('batchgen._') and not m.startswith('{package}')); "
        "assert not ours, ours"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=_REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
