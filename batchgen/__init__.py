"""batchgen: offline batch text generation.

The public names are imported lazily so that `import batchgen.radix` (pure Python) does not pull
torch in, and so that `import batchgen` stays cheap for the CLI's `--help`.
"""

from __future__ import annotations

from pathlib import Path as _Path

from batchgen._lazy import lazy_getattr
from batchgen._source_layout import install_source_layout

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "CompletionOutput",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "__version__",
    "generate",
]

install_source_layout(_Path(__file__).resolve().parent)

__getattr__ = lazy_getattr(
    "batchgen",
    {
        "LLM": "llm",
        "SamplingParams": "engine.sampling_params",
        "StructuredOutputsParams": "engine.structured.params",
        "RequestOutput": "engine.outputs",
        "CompletionOutput": "engine.outputs",
        "generate": "job.generate",
    },
)
