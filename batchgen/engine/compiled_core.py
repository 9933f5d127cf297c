"""The engine's bookkeeping core compiled to C with mypyc: the same source files, run natively.

A simulation spends its time in the scheduler, the KV block manager and the radix cache: pure
Python over ints, lists and dicts, run for every generated token of every row. mypyc compiles
exactly those modules (`CORE_MODULES`, fully typed: `mypy --strict` passes on them) into C
extensions, which do the same work in about 30% fewer instructions. Nothing is rewritten: the
compiled modules are built from the installed `.py` files, so the Python modules stay the one
source and the reference, and a test runs both on the same workload and compares every plan.

    build_core(cache_root)        -> folder with one extension per core module (built once per
                                     source, Python and mypy version; later calls reuse it)
    install_core(folder)          -> the next imports of the core modules load the extensions
                                     (refused once any of them is imported in Pure Python)
    enable_core(mode, cache_root) -> "compiled" or "python", the CLI's `--core auto|compiled|python`

Building needs mypy (`pip install batchgen[compile]`; the dev extra has it) and the C compiler
Python was built with; `auto` falls back to Python with a one-line reason when either is
missing. The build takes about half a minute and runs in a child process.

May import: the standard library (and mypy's version, to key a build). Never the core modules:
they must not be imported before `install_core`.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = [
    "CORE_MODULES",
    "CoreBuildError",
    "build_core",
    "compiled_core_folder",
    "enable_core",
    "install_core",
    "is_core_compiled",
]

# The modules compiled, in the installed package's names. A module that imports one of these
# at import time must come after it: none of them may be imported before `install_core`.
CORE_MODULES: tuple[str, ...] = (
    "batchgen.radix.hashing",
    "batchgen.radix.block_pool",
    "batchgen.radix.radix_cache",
    "batchgen.radix.kv_cache_manager",
    "batchgen.engine.sequence",
    "batchgen.engine.step_plan",
    "batchgen.engine.scheduler",
)
# Python modules the core imports names from: mypyc checked the core against them, so a change
# in them builds the core again too.
_KEY_MODULES = ("batchgen.engine.config", "batchgen.engine.sampling_params")
# The installed package's sub-packages that may live outside `batchgen/` in a source checkout
# (pyproject's package-dir maps them): the build copies them into one tree for mypy.
_MAPPED_PACKAGES = ("batchgen.radix", "batchgen.kernels", "batchgen.io")
_DONE_MARK = "built.txt"
_MYPY_INI = "[mypy]\nignore_missing_imports = True\n"


class CoreBuildError(RuntimeError):
    """The compiled core could not be built or installed; the message says why."""


def _package_dirs() -> dict[str, Path]:
    """Each package of the build tree and the folder its files come from."""
    dirs: dict[str, Path] = {}
    for name in ("batchgen", *_MAPPED_PACKAGES):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise CoreBuildError(f"cannot find the package {name}")
        dirs[name] = Path(next(iter(spec.submodule_search_locations)))
    return dirs


def _module_file(dirs: dict[str, Path], module: str) -> Path:
    """The source of a module of the package tree `dirs` describes."""
    parts = module.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:depth])
        if package in dirs:
            return dirs[package].joinpath(*parts[depth:-1], f"{parts[-1]}.py")
    raise CoreBuildError(f"{module} is outside the batchgen package")


def _build_key(dirs: dict[str, Path]) -> str:
    """A digest of what the extensions depend on: the core's sources and those it imports
    from, Python, mypy."""
    import mypy.version

    digest = hashlib.sha256()
    digest.update(sys.version.encode())
    digest.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    digest.update(mypy.version.__version__.encode())
    for module in (*CORE_MODULES, *_KEY_MODULES):
        digest.update(module.encode())
        digest.update(_module_file(dirs, module).read_bytes())
    return digest.hexdigest()[:20]


def _missing_tools() -> str | None:
    """Why a build cannot run here, or None."""
    for module in ("mypy", "mypyc", "setuptools"):  # mypyc builds through setuptools
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'batchgen[compile]')"
    compiler = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler}) on PATH"
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").exists():
        return "Python's C headers (Python.h) are not installed"
    return None


def _copy_tree(dirs: dict[str, Path], tree: Path) -> None:
    """The installed package's .py files laid out as it is imported (batchgen/radix/...)."""
    for package, src in dirs.items():
        dst = tree.joinpath(*package.split("."))
        for path in src.rglob("*.py"):
            rel = path.relative_to(src)
            if "__pycache__" in rel.parts:
                continue
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def _run_mypyc(tree: Path, log: Path) -> None:
    (tree / "mypy.ini").write_text(_MYPY_INI, encoding="utf-8")
    files = [str(Path(*module.split(".")).with_suffix(".py")) for module in CORE_MODULES]
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "mypyc", *files],
            cwd=tree, stdout=out, stderr=subprocess.STDOUT, check=False,
            env={**os.environ, "PYTHONPATH": "", "PYTHONDONTWRITEBYTECODE": "1"},
        )
    if proc.returncode != 0:
        raise CoreBuildError(f"mypyc failed (exit {proc.returncode}); its output: {log}")


def build_core(cache_root: Path, *, quiet: bool = True) -> Path:
    """The folder of the compiled core for the installed sources, built now if needed.

    The folder holds `<module>.<ext>` for each core module plus mypyc's shared library, and is
    named by `_build_key`, so changed sources build a new one. A half-built folder is never
    used: the build runs in a temporary folder that is renamed into place when it is complete.
    Raises CoreBuildError when the tools are missing or the build fails (the message names the
    build's log)."""
    missing = _missing_tools()
    if missing is not None:
        raise CoreBuildError(missing)
    dirs = _package_dirs()
    folder = cache_root / _build_key(dirs)
    if (folder / _DONE_MARK).exists():
        return folder
    if not quiet:
        print("compiling the engine core with mypyc (once for these sources, about 30 s)...", file=sys.stderr)
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        return _build_into(cache_root, folder, dirs)
    except OSError as exc:  # an unwritable cache, a full disk: the build cannot be kept
        raise CoreBuildError(f"cannot build into {cache_root}: {exc}") from exc


def _build_into(root: Path, folder: Path, dirs: dict[str, Path]) -> Path:
    """`build_core`'s build, in a temporary folder under `root` renamed to `folder` at the end."""
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    try:
        tree = work / "tree"
        _copy_tree(dirs, tree)
        log = root / f"{folder.name}.log"
        _run_mypyc(tree, log)
        staged = work / "out"
        staged.mkdir()
        suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
        for module in CORE_MODULES:
            built = tree.joinpath(*module.split(".")).with_name(module.rpartition(".")[2] + suffix)
            if not built.exists():
                raise CoreBuildError(f"mypyc wrote no {built.name} for {module}; its output: {log}")
            shutil.copyfile(built, staged / f"{module}{suffix}")
        shared = [p for p in tree.glob(f"*__mypyc{suffix}")]
        if len(shared) != 1:
            raise CoreBuildError(f"expected one mypyc shared library, found {len(shared)}; its output: {log}")
        shutil.copyfile(shared[0], staged / shared[0].name)
        (staged / _DONE_MARK).write_text("\n".join(CORE_MODULES) + "\n", encoding="utf-8")
        try:
            staged.rename(folder)
        except OSError:
            if not (folder / _DONE_MARK).exists():  # not another process that finished first
                raise
        log.unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


class _CoreFinder(importlib.abc.MetaPathFinder):
    """Finds the core modules' extensions in one built folder; every other name falls through."""

    def __init__(self, folder: Path) -> None:
        suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
        self.folder = folder
        self.paths = {module: folder / f"{module}{suffix}" for module in CORE_MODULES}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        so = self.paths.get(fullname)
        if so is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.util.spec_from_file_location(fullname, so, loader=loader)


def compiled_core_folder() -> Path | None:
    """The folder whose extensions this process's core imports load, or None (pure Python)."""
    for finder in sys.meta_path:
        if isinstance(finder, _CoreFinder):
            return finder.folder
    return None


def _check_not_imported() -> None:
    """CoreBuildError when a core module is imported already, and not from a compiled core."""
    if compiled_core_folder() is not None:
        return
    loaded = [m for m in CORE_MODULES if m in sys.modules]
    if loaded:
        raise CoreBuildError(f"this process imported the core as Python already ({', '.join(loaded)})")


def install_core(folder: Path) -> None:
    """Make this process import the core modules from `folder` (a `build_core` result).

    Raises CoreBuildError when one of them is already imported (its Python version would stay
    in use next to compiled ones) or the folder is not a complete build."""
    current = compiled_core_folder()
    if current == folder:
        return
    if current is not None:
        raise CoreBuildError(f"this process runs the compiled core of {current} already")
    _check_not_imported()
    finder = _CoreFinder(folder)
    absent = [p.name for p in finder.paths.values() if not p.exists()]
    if absent or not (folder / _DONE_MARK).exists():
        raise CoreBuildError(f"{folder} is not a complete core build (missing {', '.join(absent) or _DONE_MARK})")
    # mypyc's shared library is a top-level module that the extensions import by name.
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    sys.meta_path.insert(0, finder)


def is_core_compiled() -> bool:
    """Whether the imported scheduler is the compiled one (False before it is imported)."""
    module = sys.modules.get("batchgen.engine.scheduler")
    return module is not None and not str(getattr(module, "__file__", "")).endswith(".py")


def enable_core(mode: str, cache_root: Path, *, quiet: bool = True) -> tuple[str, str | None]:
    """Apply `--core`: ("compiled", None) or ("python", why not compiled; None when asked).

    `python` changes nothing; `compiled` raises CoreBuildError when the core cannot be built
    and installed; `auto` falls back to Python with the reason."""
    if mode not in ("auto", "compiled", "python"):
        raise ValueError(f"core must be auto, compiled or python, got {mode!r}")
    if mode == "python":
        return "python", None
    try:
        _check_not_imported()  # before a build: a process that imported the core cannot switch
        install_core(build_core(cache_root, quiet=quiet))
    except CoreBuildError as exc:
        if mode == "compiled":
            raise
        return "python", str(exc)
    return "compiled", None
