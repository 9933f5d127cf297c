"""A pytest plugin (loaded by tests/conftest.py): a test that loads the built-in model or runs a
job in a child process must carry `@pytest.mark.slow`, as the README's `-m "not slow"` promises.

It watches what each test really does, not how it is written:
- the real model: the built-in SmolLM2 GGUF (`default_model_path()`) opened while its weights
  are read, by batchgen's `load_gguf` (`LLM()`, `load_checkpoint(None)`, a job without a model)
  or by transformers' `load_gguf_checkpoint(..., return_tensors=True)`. Reading only its
  tokenizer (`tests.tiny_models.smollm2_tokenizer`, the tokenizer tests) is not loading it;
- a job in a child process: a subprocess whose arguments run the `run` or `run-batch` command
  through the `batchgen` command or `python -m batchgen`, a script of the test suite (the kill
  wrappers `tests/job/helpers.py`, `tests/ray/kill_driver.py`, ...) or `-c` code that calls
  `batchgen.cli.main` (the command in its arguments or quoted in the code).
Both are seen through audit hooks (`sys.addaudithook`: "open" with the frames that opened the
file, "subprocess.Popen" with its arguments), so nothing of batchgen is patched. A fixture that
did either is remembered, so every later test that uses it (a module-scoped fixture is set up
once) must be slow too. An unmarked test that does either fails, with a message
naming what it did. Work done in a child process is seen only as far as its command line.

Imports pytest and, lazily, batchgen.models.checkpoint (for the model's path).
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

__all__ = ["Watch", "describe_job_subprocess", "is_weight_load"]

_WEIGHT_LOADERS = {
    ("gguf_loader.py", "load_gguf"),  # batchgen.models.gguf_loader.load_gguf
    ("modeling_gguf_pytorch_utils.py", "load_gguf_checkpoint"),  # transformers
}
_JOB_COMMANDS = {"run", "run-batch"}


def is_weight_load(frame: FrameType | None) -> bool:
    """True when one of the calling frames reads a GGUF's weights (not only its metadata)."""
    while frame is not None:
        code = frame.f_code
        if (Path(code.co_filename).name, code.co_name) in _WEIGHT_LOADERS:
            return code.co_name == "load_gguf" or bool(frame.f_locals.get("return_tensors"))
        frame = frame.f_back
    return False


def describe_job_subprocess(args: Any) -> str | None:
    """The command line when `args` (a subprocess's) runs a batchgen job; None otherwise."""
    argv = [os.fsdecode(a) for a in args] if isinstance(args, list | tuple) else [os.fsdecode(args)]
    has_command = bool(_JOB_COMMANDS & set(argv))
    runs_batchgen = Path(argv[0]).name == "batchgen" or any(
        a == "-m" and b == "batchgen" for a, b in itertools.pairwise(argv)
    )
    runs_script = any(a.endswith(".py") and "tests" in Path(a).parts for a in argv)
    codes = [b for a, b in itertools.pairwise(argv) if a == "-c" and "batchgen.cli.main" in b]
    code_runs_job = any(f"'{c}'" in code or f'"{c}"' in code for code in codes for c in _JOB_COMMANDS)
    is_job = (has_command and (runs_batchgen or runs_script or bool(codes))) or code_runs_job
    return " ".join(argv)[:200] if is_job else None


@dataclass
class Watch:
    """What the test now running did; reset before each test phase."""

    model_path: str | None
    loaded_real_model: bool = False
    job_subprocesses: list[str] = field(default_factory=list)
    # (baseid, argname) -> what the fixture did, for the tests that use its cached value
    heavy_fixtures: dict[tuple[str, str], str] = field(default_factory=dict)

    def reset(self) -> None:
        self.loaded_real_model = False
        self.job_subprocesses = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path = args[0]
            if (
                self.model_path is not None
                and isinstance(path, str | bytes | os.PathLike)
                and os.fsdecode(path) == self.model_path
                and is_weight_load(sys._getframe(1))
            ):
                self.loaded_real_model = True
        elif event == "subprocess.Popen":
            command = describe_job_subprocess(args[1])
            if command is not None:
                self.job_subprocesses.append(command)

    def problems(self) -> list[str]:
        """What the test phase now ending did that needs the slow marker."""
        found = ["it loads the built-in SmolLM2 model"] if self.loaded_real_model else []
        return found + [f"it runs a job in a subprocess: {command}" for command in self.job_subprocesses]

    def fixture_problems(self, item: pytest.Item) -> list[str]:
        """What the fixtures `item` uses did when they were set up (perhaps for an earlier test)."""
        used = set(getattr(item, "fixturenames", ()))
        return [
            f"its fixture {name} did: {what}"
            for (base, name), what in sorted(self.heavy_fixtures.items())
            if name in used and item.nodeid.startswith(base)
        ]


_WATCH = pytest.StashKey[Watch]()


def _model_path() -> str | None:
    try:
        from batchgen.models.checkpoint import default_model_path

        return str(default_model_path())
    except (ImportError, FileNotFoundError):
        return None  # no built-in model here: nothing can load it


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: the real model, scale runs, jobs in subprocesses")
    watch = Watch(model_path=_model_path())
    config.stash[_WATCH] = watch
    sys.addaudithook(watch.audit)  # audit hooks stay for the process; the watch is per session


def _check(item: pytest.Item, phase: str) -> None:
    watch = item.config.stash[_WATCH]
    problems = watch.problems() + watch.fixture_problems(item)
    if problems and item.get_closest_marker("slow") is None:
        pytest.fail(
            f"{item.nodeid} is not marked slow, but {'; '.join(dict.fromkeys(problems))} (seen in {phase}); "
            "mark it @pytest.mark.slow (README: -m 'not slow' leaves such tests out)",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Generator[None, Any, Any]:
    watch = request.config.stash[_WATCH]
    loaded, launched = watch.loaded_real_model, watch.job_subprocesses
    watch.reset()
    try:
        return (yield)
    finally:
        if watch.problems():
            watch.heavy_fixtures[(fixturedef.baseid, fixturedef.argname)] = "; ".join(watch.problems())
        watch.loaded_real_model = watch.loaded_real_model or loaded
        watch.job_subprocesses = launched + watch.job_subprocesses


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    item.config.stash[_WATCH].reset()
    yield
    _check(item, "setup")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    item.config.stash[_WATCH].reset()
    yield
    _check(item, "the test")
