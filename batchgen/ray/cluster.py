"""Reaching a Ray cluster: the import with an install hint, the connection, the resource check,
and whether the cluster can still run a worker (`node_shortage`, asked after a worker failed).

May import: ray (lazily), batchgen.job, batchgen.io.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from batchgen.io import InputError
from batchgen.job.config import JobConfig, RayConfig

__all__ = ["check_resources", "connect", "import_ray", "node_shortage"]

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


def _wanted(config: RayConfig) -> tuple[tuple[str, str, float], ...]:
    return (
        ("num_cpus_per_worker", "CPU", config.num_cpus_per_worker),
        ("num_gpus_per_worker", "GPU", config.num_gpus_per_worker),
    )


def _alive_node_resources(ray: ModuleType) -> list[Mapping[str, Any]]:
    return [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]


def check_resources(ray: ModuleType, config: JobConfig) -> None:
    """Raises InputError when a worker asks for more CPUs or GPUs than the cluster has, or than
    any one node has (a worker runs on one node: it could never start)."""
    total = ray.cluster_resources()
    nodes = _alive_node_resources(ray)
    for key, resource, amount in _wanted(config.ray):
        if amount > total.get(resource, 0):
            raise InputError(
                f"{config.source}: ray.{key}: {amount:g} {resource}s per worker, but the cluster "
                f"has {total.get(resource, 0):g} in all"
            )
        largest = max((node.get(resource, 0) for node in nodes), default=0)
        if amount > largest:
            raise InputError(
                f"{config.source}: ray.{key}: {amount:g} {resource}s per worker, but no node of "
                f"the cluster has that many (the largest has {largest:g})"
            )


def node_shortage(ray: ModuleType, config: RayConfig) -> str | None:
    """Why the cluster cannot run a worker any more (its connection shut down, no node alive, no
    alive node with the CPUs and GPUs of one worker), or None when some alive node could.
    Counts each node's total resources: a worker that died frees its share."""
    if not ray.is_initialized():
        return "the connection to the Ray cluster was shut down"
    try:
        nodes = _alive_node_resources(ray)
    except (ray.exceptions.RayError, ConnectionError, ValueError, RuntimeError) as exc:
        return f"the Ray cluster does not answer ({type(exc).__name__}: {exc})"
    if not nodes:
        return "no node of the Ray cluster is alive"
    wanted = _wanted(config)
    if not any(all(node.get(resource, 0) >= amount for _, resource, amount in wanted) for node in nodes):
        need = " and ".join(f"{amount:g} {resource}s" for _, resource, amount in wanted)
        return f"none of its {len(nodes)} alive node(s) has the {need} of one worker"
    return None
