"""Node-loss wrapper of the driver test (no tests in here): runs `batchgen.cli.main.main(ARGS)`,
which starts its own local Ray, and right after the driver recorded its K-th shard in the
manifest kills this node's Ray dashboard agent; the raylet shuts down with it and takes the
workers along, as in issue 20's incident::

    python lose_node.py NOTE K run job.yaml --quiet ...

Writes NOTE (JSON: the shards recorded when it struck, the pids it killed) and exits with the
CLI's exit code. It kills only processes this process started (its own Ray's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _agents() -> list[Any]:
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if "DashboardAgent" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue  # gone meanwhile
    return found


def _main(argv: list[str]) -> int:
    note, k, *cli_args = argv
    from batchgen.io.manifest import Manifest

    real = Manifest.mark_committed
    recorded: list[str] = []

    def mark_committed(self: Any, shard_name: str, record: Any) -> None:
        real(self, shard_name, record)
        recorded.append(shard_name)
        if len(recorded) == int(k):
            agents = _agents()
            for process in agents:
                process.kill()
            Path(note).write_text(json.dumps({"recorded": recorded, "killed": [p.pid for p in agents]}))

    Manifest.mark_committed = mark_committed  # type: ignore[method-assign]
    from batchgen.cli.main import main

    return main(cli_args) or 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
