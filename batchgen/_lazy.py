"""Lazy public names for a package: `__getattr__` that imports the owning module on first use.

Packages re-export their public names this way so that importing one light module of a package
(a config, say) does not import torch or the rest of the package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, owners: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package`: name -> attribute of module `owners[name]`
    (relative to `package`). Raises AttributeError for any other name."""

    def __getattr__(name: str) -> Any:
        module = owners.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
