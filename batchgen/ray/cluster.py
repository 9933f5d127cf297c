"""Reaching a Ray cluster: the import with an install hint, the connection, the resource check.

May import: ray (lazily), batchgen.job, batchgen.io.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from batchgen.io import InputError
from batchgen.job.config import JobConfig

__all__ = ["check_resources", "connect", "import_ray"]

_INSTALL_HINT = "pip install 'batchgen[ray]' (or pip install 'ray[data]>=2.40')"


def import_ray(source: Path | str) -> ModuleType:
    """The `ray` module. Raises InputError naming `source` with how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise InputError(f"{source}: executor: ray needs Ray, which is not installed: {_INSTALL_HINT}") from exc
    return ray


def connect(ray: ModuleType, config: JobConfig) -> bool:
    """Join (or start) the cluster unless this process already did; True if it connected."""
    if ray.is_initialized():
        return False
    try:
        # A Ray started here serves this machine only: bind it to the loopback address.
        local = {"_node_ip_address": "127.0.0.1"} if config.ray.address is None else {}
        ray.init(address=config.ray.address, logging_level="warning", log_to_driver=True, **local)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise InputError(
            f"{config.source}: ray.address: cannot reach a Ray cluster at "
            f"{config.ray.address or 'a local Ray'}: {exc}"
        ) from exc
    return True


def check_resources(ray: ModuleType, config: JobConfig) -> None:
    """Raises InputError when a worker asks for more CPUs or GPUs than the cluster has."""
    total = ray.cluster_resources()
    wanted = config.ray
    for key, resource, amount in (
        ("num_cpus_per_worker", "CPU", wanted.num_cpus_per_worker),
        ("num_gpus_per_worker", "GPU", wanted.num_gpus_per_worker),
    ):
        if amount > total.get(resource, 0):
            raise InputError(
                f"{config.source}: ray.{key}: {amount:g} {resource}s per worker, but the cluster "
                f"has {total.get(resource, 0):g} in all"
            )
