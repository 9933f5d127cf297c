"""The import arrows of STYLE.md, checked over the source (static: every import statement).

cli, api -> pipeline -> io;  pipeline -> engine -> radix;  engine -> runner -> model -> kernels.
io, radix and kernels import nothing of ours; radix and io do not import torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"batchgen": ROOT / "batchgen", "batchgen.radix": ROOT / "radix", "batchgen.io": ROOT / "io",
            "batchgen.kernels": ROOT / "kernels"}

TOP = {"cli", "api", "job", "bench", "gpu_check", "__main__"}
PIPELINE = {"pipeline", "pipeline_types", "shard_assembly", "prepare", "job_config"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def _layer(module: str) -> str:
    for package in ("batchgen.radix", "batchgen.io", "batchgen.kernels"):
        if module == package or module.startswith(package + "."):
            return package
    leaf = module.split(".")[1] if module.count(".") else ""
    if leaf in TOP:
        return "top"
    if leaf in PIPELINE:
        return "pipeline"
    return "engine"


MODULES = _modules()
FORBIDDEN = {
    "batchgen.radix": {"top", "pipeline", "engine", "batchgen.io", "batchgen.kernels"},
    "batchgen.io": {"top", "pipeline", "engine", "batchgen.radix", "batchgen.kernels"},
    "batchgen.kernels": {"top", "pipeline", "engine", "batchgen.radix", "batchgen.io"},
    "engine": {"top", "pipeline", "batchgen.io"},
    "pipeline": {"top"},
    "top": set(),
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module: str) -> None:
    layer = _layer(module)
    ours = {m for m in _imports(module, MODULES[module]) if m in MODULES}
    bad = sorted(m for m in ours if _layer(m) in FORBIDDEN[layer] and _layer(m) != layer)
    assert not bad, f"{module} ({layer}) imports {bad}"
    if layer in ("batchgen.radix", "batchgen.io"):
        third_party = {m.split(".")[0] for m in _imports(module, MODULES[module])}
        assert "torch" not in third_party


def test_the_scan_sees_the_packages() -> None:
    assert "batchgen.radix.block_pool" in MODULES and "batchgen.engine" in MODULES
    assert "batchgen.radix" in _imports("batchgen.scheduler", MODULES["batchgen.scheduler"])
