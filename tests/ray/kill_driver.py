"""Kill wrapper of the driver test (no tests in here): runs `batchgen.cli.main.main(ARGS)` and
SIGKILLs its own process right after the driver recorded its K-th shard in the manifest::

    python kill_driver.py NOTE K run job.yaml --quiet ...

Before dying it writes the shard names recorded so far to NOTE (JSON). A kill that never
happens lets the run finish (exit 0), which the test reports as a failure.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any


def _main(argv: list[str]) -> int:
    note, k, *cli_args = argv
    from batchgen.io.manifest import Manifest

    real = Manifest.mark_committed
    recorded: list[str] = []

    def mark_committed(self: Any, shard_name: str, record: Any) -> None:
        real(self, shard_name, record)
        recorded.append(shard_name)
        if len(recorded) == int(k):
            Path(note).write_text(json.dumps(recorded))
            os.kill(os.getpid(), signal.SIGKILL)

    Manifest.mark_committed = mark_committed  # type: ignore[method-assign]
    from batchgen.cli.main import main

    return main(cli_args)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
