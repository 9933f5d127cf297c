"""Kill wrapper of the run-batch resume tests (no tests in here)::

    python run_batch_kill.py KIND K run-batch -i ... -o ...

KIND picks the moment the process SIGKILLs itself (K counts from 1):
- ``write``         the K-th `JsonlShardWriter.write`, before it writes;
- ``after_rename``  right after the K-th rename onto a final ``*.jsonl`` file (before the
                    manifest records it).
A kill that never happens lets the run finish (exit 0), which the tests report as a failure.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    kind, arg, *cli_args = argv
    wanted = int(arg)
    count = 0
    if kind == "write":
        from batchgen.io import jsonl_writer

        real_write = jsonl_writer.JsonlShardWriter.write

        def write(self: Any, lines: Any) -> None:
            nonlocal count
            count += 1
            if count == wanted:
                _kill()
            real_write(self, lines)

        jsonl_writer.JsonlShardWriter.write = write  # type: ignore[method-assign]
    elif kind == "after_rename":
        real_replace = os.replace

        def replace(src: Any, dst: Any, **kwargs: Any) -> None:
            nonlocal count
            real_replace(src, dst, **kwargs)
            name = Path(os.fsdecode(dst)).name
            if name.endswith(".jsonl") and not name.startswith("."):
                count += 1
                if count == wanted:
                    _kill()

        os.replace = replace
    else:
        raise SystemExit(f"kill wrapper: unknown kind {kind!r}")
    from batchgen.cli.main import main as cli_main

    return cli_main(cli_args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main(sys.argv[1:]))
