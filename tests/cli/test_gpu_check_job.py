"""The prepared GPU job (jobs/gpu): `prepare` writes the carried folder and ignores it, `dry-run`
lists what a device call would send and holds it to 64 MiB, and the device script runs gpu-check
with its options. Run against a shallow clone of this checkout, so this checkout's
.git/info/exclude is never touched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchgen.data.workloads import build_workload, read_requests
from batchgen.models.config import ModelConfig
from batchgen.tokenizer.tokenizer import Tokenizer
from tests.tiny_models import smollm2_tokenizer

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "gpu" / "gpu_job.py"
CARRIED = ["model/config.json", "model/random_weights.json", "model/tokenizer.json", "model/tokenizer_config.json", "requests.jsonl"]


def _job(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(JOB), *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("clone") / "repo"
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{REPO}", str(root)], check=True, timeout=300)
    prepared = _job("prepare", "--repo", str(root), "--num-requests", "4", "--max-tokens", "16")
    return {"root": root, "prepare": prepared}


def test_prepare_writes_the_carried_folder_and_ignores_it(clone: dict[str, Any]) -> None:
    root, prepared = clone["root"], clone["prepare"]
    assert prepared.returncode == 0, prepared.stderr
    carry = root / ".gpucheck"
    assert sorted(str(p.relative_to(carry)) for p in carry.rglob("*") if p.is_file()) == CARRIED
    assert "/.gpucheck/" in (root / ".git" / "info" / "exclude").read_text().splitlines()
    assert subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout == ""
    config = ModelConfig.from_hf_dict(json.loads((carry / "model" / "config.json").read_text()))
    assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == (
        49152, 576, 30, 9, 3
    )
    tokenizer = Tokenizer.from_hf_folder(carry / "model")
    chat = [{"role": "user", "content": "Name three rivers."}]
    assert tokenizer.encode_chat(chat) == smollm2_tokenizer().encode_chat(chat)
    expected = build_workload("single-turn", smollm2_tokenizer(), num_requests=4, max_tokens=16)
    assert read_requests(carry / "requests.jsonl") == expected


def test_dry_run_lists_what_travels_under_64_mib(clone: dict[str, Any]) -> None:
    proc = _job("dry-run", "--repo", str(clone["root"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    total = re.search(r"^total: ([0-9.]+) MiB of 64 MiB$", proc.stdout, re.M)
    assert total is not None and 0 < float(total.group(1)) < 64
    for name in CARRIED:
        assert re.search(rf"MiB  {re.escape(name)}$", proc.stdout, re.M), name
    assert 'device call: run(command="bash jobs/gpu/device_check.sh", carry=[".gpucheck"], timeout_s=330)' in proc.stdout


def test_dry_run_refuses_an_oversized_or_unignored_carry(clone: dict[str, Any]) -> None:
    root = clone["root"]
    big = root / ".gpucheck" / "big.bin"
    with big.open("wb") as f:
        f.truncate(65 * 2**20)  # sparse: 65 MiB travel, nothing is written
    try:
        proc = _job("dry-run", "--repo", str(root))
    finally:
        big.unlink()
    assert proc.returncode == 1
    assert re.search(r"error: [0-9.]+ MiB would travel, over the 64 MiB limit", proc.stderr), proc.stderr
    loose = root / "loose"
    for name in CARRIED:
        (loose / name).parent.mkdir(parents=True, exist_ok=True)
        (loose / name).write_text("{}")
    proc = _job("dry-run", "--repo", str(root), "--carry", str(loose))
    assert proc.returncode == 1
    assert f"error: {loose} is not ignored by git" in proc.stderr


def test_device_script_runs_gpu_check_with_its_options(tmp_path: Path) -> None:
    out = tmp_path / "OUT"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # CUDA hidden: the script's own run of gpu-check then stops after the preflight, exit 2.
    env.update(OUT=str(out), CUDA_VISIBLE_DEVICES="", PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]))
    proc = subprocess.run(["bash", str(REPO / "jobs" / "gpu" / "device_check.sh")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "gpu-check exit code: 2" in proc.stdout
    log = (out / "gpu_check.log").read_text()
    assert "gpu-check needs a CUDA GPU" in log and "Traceback" not in log
    options = json.loads((out / "gpu_check.json").read_text())["options"]
    assert {k: options[k] for k in ("model", "requests", "budget_s", "kernel_tests_timeout_s", "num_prompts", "work_dir")} == {
        "model": ".gpucheck/model",
        "requests": ".gpucheck/requests.jsonl",
        "budget_s": 270.0,
        "kernel_tests_timeout_s": 120.0,
        "num_prompts": 128,
        "work_dir": "/tmp/batchgen-gpu-check",
    }
