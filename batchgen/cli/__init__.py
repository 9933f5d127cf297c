"""The command line: `batchgen run`, `bench`, `gpu-check`, `prepare-sharegpt`.

The only layer that reads environment variables and sets process-wide torch options.
May import every other package.
"""

from __future__ import annotations

from batchgen.cli.main import main

__all__ = ["main"]
