"""The import arrows of STYLE.md, checked over the source (static: every import statement).

    cli -> job -> engine -> models -> kernels;  job -> io;  engine -> radix;
    job, engine, models -> tokenizer;  cli, job -> data;  cli -> ray -> job (and job's arrows);
    cli -> report -> io;  cli -> sim -> job (and job's arrows)

Layers are read off the tree: each subpackage of batchgen/ is a layer, the root folders radix/,
io/, kernels/ are three more, the top-level modules (`llm.py`) are the public face, and
`batchgen/__init__.py` with the private helpers (`batchgen/_*.py`) a base every batchgen layer
may use. An arrow is
allowed only if listed below; radix, io and kernels import nothing of ours, radix and io no torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOT_PACKAGES = {"batchgen.radix": ROOT / "radix", "batchgen.io": ROOT / "io", "batchgen.kernels": ROOT / "kernels"}
SUBPACKAGES = sorted(p.parent.name for p in (ROOT / "batchgen").glob("*/__init__.py"))

BASE = "batchgen._base"
API = "batchgen"
# layer -> the layers it may import (its own always allowed).
ALLOWED: dict[str, set[str]] = {
    "batchgen.cli": {API, "batchgen.job", "batchgen.engine", "batchgen.models", "batchgen.tokenizer",
                     "batchgen.data", "batchgen.kernels", "batchgen.radix", "batchgen.io", "batchgen.ray",
                     "batchgen.report", "batchgen.sim", BASE},
    # executor: ray and the Ray Data stage sit above the job layer.
    "batchgen.ray": {"batchgen.job", "batchgen.engine", "batchgen.models", "batchgen.tokenizer",
                     "batchgen.io", "batchgen.data", BASE},
    # the simulator drives the job's pipeline and the engine with a cost model for a runner.
    "batchgen.sim": {"batchgen.job", "batchgen.engine", "batchgen.models", "batchgen.tokenizer",
                     "batchgen.io", "batchgen.data", "batchgen.radix", BASE},
    API: {"batchgen.engine", "batchgen.models", "batchgen.tokenizer", BASE},
    "batchgen.job": {"batchgen.engine", "batchgen.models", "batchgen.tokenizer", "batchgen.data",
                     "batchgen.radix", "batchgen.io", BASE},
    "batchgen.engine": {"batchgen.models", "batchgen.tokenizer", "batchgen.kernels", "batchgen.radix", BASE},
    "batchgen.models": {"batchgen.tokenizer", "batchgen.kernels", BASE},
    "batchgen.tokenizer": {BASE},
    "batchgen.data": {BASE},
    "batchgen.report": {"batchgen.io", BASE},
    BASE: set(),
    "batchgen.radix": set(),
    "batchgen.io": set(),
    "batchgen.kernels": set(),
}
NO_TORCH = {"batchgen.radix", "batchgen.io", "batchgen.report"}


def _modules() -> dict[str, Path]:
    found = {}
    folders = {"batchgen": ROOT / "batchgen", **ROOT_PACKAGES}
    for package, folder in folders.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def layer_of(module: str) -> str:
    for package in ROOT_PACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    parts = module.split(".")
    if len(parts) == 1:
        return BASE  # batchgen/__init__.py: the version and lazy re-exports (names, not imports)
    if parts[1] in SUBPACKAGES:
        return f"batchgen.{parts[1]}"
    if parts[1] == "__main__":
        return "batchgen.cli"  # `python -m batchgen` is the command line
    return BASE if parts[1].startswith("_") else API


def imports_of(module: str, source: str, *, is_package: bool = False) -> set[str]:
    """Every module named by an import in `source` (relative imports resolved)."""
    package = module if is_package else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{alias.name}" for alias in node.names)
    return out


MODULES = _modules()


def violations(module: str, source: str, *, is_package: bool = False) -> list[str]:
    """The imports in `source` (as if it were `module`) that go against the arrows."""
    layer = layer_of(module)
    named = imports_of(module, source, is_package=is_package)
    ours = {m for m in named if m in MODULES}
    bad = [f"{m} ({layer_of(m)})" for m in sorted(ours)
           if layer_of(m) != layer and layer_of(m) not in ALLOWED[layer]]
    if layer in NO_TORCH and "torch" in {m.split(".")[0] for m in named}:
        bad.append("torch")
    return bad


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module: str) -> None:
    path = MODULES[module]
    assert layer_of(module) in ALLOWED, f"{module}: new layer {layer_of(module)}; add its arrows here"
    bad = violations(module, path.read_text(), is_package=path.name == "__init__.py")
    assert not bad, f"{module} ({layer_of(module)}) imports {bad}"


def test_the_scan_sees_the_packages() -> None:
    assert {"cli", "data", "engine", "job", "models", "tokenizer"} <= set(SUBPACKAGES)
    assert layer_of("batchgen.engine.scheduler") == "batchgen.engine"
    assert layer_of("batchgen.llm") == API and layer_of("batchgen._lazy") == layer_of("batchgen") == BASE
    assert "batchgen.radix" in imports_of("batchgen.engine.scheduler", MODULES["batchgen.engine.scheduler"].read_text())


@pytest.mark.parametrize(
    ("module", "planted"),
    [
        ("batchgen.engine.scheduler", "from batchgen.job.run import run_job"),
        ("batchgen.engine.scheduler", "from ..job import run"),
        ("batchgen.models.llama", "import batchgen.engine.llm_engine"),
        ("batchgen.engine.runner", "from batchgen.io import OutputRow"),
        ("batchgen.job.pipeline", "from batchgen.cli.bench import run_bench"),
        ("batchgen.job.run", "from batchgen.ray.driver import run_ray_job"),
        ("batchgen.ray.driver", "from batchgen.cli.main import main"),
        ("batchgen.sim.job", "from batchgen.report import write_job_report"),
        ("batchgen.job.run", "from batchgen.sim.job import simulate_job"),
        ("batchgen.engine.llm_engine", "from batchgen.sim.runner import SimClock"),
        ("batchgen.radix.block_pool", "from batchgen.engine.sequence import Sequence"),
        ("batchgen.radix.block_pool", "import torch"),
        ("batchgen.kernels.dispatch", "from batchgen.models.config import ModelConfig"),
        ("batchgen.tokenizer.tokenizer", "from batchgen.models.checkpoint import Checkpoint"),
    ],
)
def test_a_planted_back_arrow_is_caught(module: str, planted: str) -> None:
    source = MODULES[module].read_text() + "\n" + planted + "\n"
    assert violations(module, source)
