"""One local Ray runtime per test module (2 CPUs, small object store), shared by its tests.

Ray's worker processes inherit this process's environment: PYTHONPATH puts this checkout first,
so the actors import the batchgen under test (and `tests.ray.hooks`), and token authentication
is off so that a job run in a subprocess can join the runtime by its address.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[Any]:
    """The `ray` module, initialized; its address is ``ray.get_runtime_context().gcs_address``."""
    ray = pytest.importorskip("ray")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_AUTH_MODE")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), saved["PYTHONPATH"]) if p)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",  # loopback only: the test's Ray talks to nothing else
        object_store_memory=256 * 2**20,
        logging_level="warning",
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
