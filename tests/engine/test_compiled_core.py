"""The compiled core (`batchgen.engine.compiled_core`): built from the installed sources with
mypyc, it makes the same plans as the Python core, step for step, and `batchgen simulate`
reports which ran.

The build (about 30 s) runs once for this file, into a temporary cache. It needs mypy and a C
compiler, which the test install has; where either is missing the tests that build are skipped
with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from batchgen.engine import compiled_core
from batchgen.engine.compiled_core import (
    CORE_MODULES,
    CoreBuildError,
    build_core,
    enable_core,
    install_core,
)

ROOT = Path(__file__).resolve().parents[2]
TRACE = Path(__file__).with_name("core_trace.py")


@pytest.fixture(scope="module")
def xdg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xdg")


@pytest.fixture(scope="module")
def core(xdg: Path) -> Path:
    missing = compiled_core._missing_tools()
    if missing is not None:
        pytest.skip(f"cannot build the compiled core here: {missing}")
    return build_core(xdg / "batchgen" / "core")


def _run(args: list[str], xdg: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False)


def test_the_build_holds_every_core_module_and_is_reused(core: Path, xdg: Path) -> None:
    names = {p.name for p in core.iterdir()}
    assert all(any(n.startswith(f"{m}.") for n in names) for m in CORE_MODULES)
    assert sum(n.endswith(".so") or n.endswith(".pyd") for n in names) == len(CORE_MODULES) + 1  # + mypyc's library
    before = core.stat().st_mtime_ns
    assert build_core(xdg / "batchgen" / "core") == core  # same sources: the same folder, not rebuilt
    assert core.stat().st_mtime_ns == before


def test_compiled_and_python_cores_make_the_same_plans(core: Path, xdg: Path) -> None:
    python = _run([str(TRACE)], xdg)
    compiled = _run([str(TRACE), str(core)], xdg)
    assert python.returncode == 0, python.stderr
    assert compiled.returncode == 0, compiled.stderr
    py_lines, c_lines = python.stdout.splitlines(), compiled.stdout.splitlines()
    assert json.loads(py_lines[-1]) == {"compiled": False}
    assert json.loads(c_lines[-1]) == {"compiled": True}
    steps = [json.loads(line) for line in py_lines[1:-1]]
    # the workload reaches what the core decides: preemptions, forks' block copies, cache hits
    # and evictions, in every round
    for name in ("continuous", "no-chunking", "no-prefix-cache"):
        last = [s for s in steps if s.get("round") == name and "stats" in s][-1]
        assert last["stats"][0] > 0, f"{name}: no preemption"
    assert sum(len(s["copies"]) for s in steps if "copies" in s) > 0
    assert max(s["kv"][3] for s in steps if "kv" in s) > 0
    assert len(py_lines) == len(c_lines) > 200
    for i, (a, b) in enumerate(zip(py_lines[1:-1], c_lines[1:-1], strict=True)):
        assert a == b, f"line {i + 1} differs"


def test_simulate_says_which_core_ran_and_predicts_the_same(core: Path, xdg: Path, tmp_path: Path) -> None:
    from tests.job.helpers import make_prompt_shards

    make_prompt_shards(tmp_path / "data", num_shards=1, rows_per_shard=30)
    (tmp_path / "job.yaml").write_text(
        "input: {path: data, columns: {id: id, prompt: prompt}}\noutput: {path: out}\n"
        "sampling: {max_tokens: 20}\nengine: {max_num_seqs: 8}\nreport: false\n",
        encoding="utf-8",
    )
    summaries = {}
    for mode in ("compiled", "python"):
        out = tmp_path / mode
        proc = _run(["-m", "batchgen", "simulate", str(tmp_path / "job.yaml"), "--core", mode, "--quiet",
                     "--out", str(out)], xdg)
        assert proc.returncode == 0, proc.stderr
        assert ("compiled core" in proc.stdout) == (mode == "compiled")
        summaries[mode] = json.loads((out / "summary.json").read_text())
    assert summaries["compiled"]["simulated"]["engine_core"] == "compiled"
    assert summaries["python"]["simulated"]["engine_core"] == "python"
    for key in ("pipeline_s", "tokens", "kv_blocks", "preemptions", "prefix_hit_rate"):
        assert summaries["compiled"][key] == summaries["python"][key], key


def test_a_process_that_imported_the_python_core_keeps_it(core: Path, tmp_path: Path) -> None:
    import batchgen.engine.scheduler  # noqa: F401  (this test process runs the Python core)

    with pytest.raises(CoreBuildError, match="imported the core as Python already"):
        install_core(core)
    with pytest.raises(CoreBuildError, match="imported the core as Python already"):
        enable_core("compiled", tmp_path)
    assert enable_core("auto", tmp_path)[0] == "python"
    assert enable_core("python", tmp_path) == ("python", None)
    with pytest.raises(ValueError, match="auto, compiled or python"):
        enable_core("fast", tmp_path)
    assert not any(tmp_path.iterdir())  # refused before any build


def test_auto_falls_back_to_python_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(compiled_core, "_check_not_imported", lambda: None)
    monkeypatch.setattr(compiled_core.shutil, "which", lambda name: None)
    core, why = enable_core("auto", tmp_path)
    assert core == "python" and why is not None and "no C compiler" in why
    with pytest.raises(CoreBuildError, match="no C compiler"):
        enable_core("compiled", tmp_path)
    assert not any(tmp_path.iterdir())  # nothing was built


def test_a_cache_that_cannot_be_written_is_a_reason_not_a_crash(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if compiled_core._missing_tools() is not None:
        pytest.skip(f"cannot build the compiled core here: {compiled_core._missing_tools()}")
    monkeypatch.setattr(compiled_core, "_check_not_imported", lambda: None)
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache would go")
    core, why = enable_core("auto", not_a_folder)
    assert core == "python" and why is not None and why.startswith(f"cannot build into {not_a_folder}")
    with pytest.raises(CoreBuildError, match="cannot build into"):
        build_core(not_a_folder)


def test_changed_sources_build_another_folder(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    dirs = compiled_core._package_dirs()
    key = compiled_core._build_key(dirs)
    copy = tmp_path / "radix"
    copy.mkdir()
    for path in dirs["batchgen.radix"].glob("*.py"):
        (copy / path.name).write_bytes(path.read_bytes())
    assert compiled_core._build_key({**dirs, "batchgen.radix": copy}) == key
    (copy / "block_pool.py").write_text((copy / "block_pool.py").read_text() + "\n# changed\n")
    assert compiled_core._build_key({**dirs, "batchgen.radix": copy}) != key
