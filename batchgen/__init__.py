"""batchgen: offline batch text generation.

The public names are imported lazily so that `import batchgen.radix` (pure Python) does not pull
torch in, and so that `import batchgen` stays cheap for the CLI's `--help`.
"""

from __future__ import annotations

import os as _os
from typing import Any

__version__ = "0.1.0"

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "__version__", "generate"]

# In a source checkout the folders radix/, kernels/ and io/ sit beside batchgen/ and are mapped to
# batchgen.radix, batchgen.kernels and batchgen.io by pyproject.toml. When Python finds this package
# through the current directory (running from the repository root) rather than through the
# installed mapping, those subpackages are only reachable if the checkout root is on __path__.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
    _os.path.join(_root, "radix", "__init__.py")
):
    __path__.append(_root)

_LAZY = {
    "LLM": "batchgen.llm",
    "SamplingParams": "batchgen.sampling_params",
    "RequestOutput": "batchgen.outputs",
    "CompletionOutput": "batchgen.outputs",
    "generate": "batchgen.api",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'batchgen' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
