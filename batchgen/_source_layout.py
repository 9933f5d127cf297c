"""Maps the repository-root folders `radix/`, `kernels/`, `io/` to `batchgen.radix`,
`batchgen.kernels`, `batchgen.io` when batchgen runs from a source checkout.

An installed batchgen gets that mapping from `pyproject.toml` (setuptools `package-dir`). A
checkout run from its root finds `batchgen/` through the current directory instead, where the
three folders are not inside the package; this finder serves exactly those three names, from the
checkout that `batchgen/` itself was found in, and nothing else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["ROOT_PACKAGES", "install_source_layout"]

ROOT_PACKAGES = {"batchgen.radix": "radix", "batchgen.kernels": "kernels", "batchgen.io": "io"}


class _RootFolderFinder(importlib.abc.MetaPathFinder):
    def __init__(self, folders: Mapping[str, Path]) -> None:
        self.folders = dict(folders)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def install_source_layout(package_dir: Path) -> None:
    """If `package_dir` (the folder of batchgen/__init__.py) sits in a source checkout, put a
    finder for the three root packages first on sys.meta_path (once). Otherwise do nothing."""
    root = package_dir.parent
    folders = {name: root / folder for name, folder in ROOT_PACKAGES.items()}
    if not (root / "pyproject.toml").is_file() or not all(
        (f / "__init__.py").is_file() for f in folders.values()
    ):
        return
    if any(isinstance(f, _RootFolderFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _RootFolderFinder(folders))
