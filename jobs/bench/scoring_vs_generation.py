"""A scoring job beside a generation job of the same rows, on the built-in model (issue 21).

usage: python jobs/bench/scoring_vs_generation.py [--rows 10000] [--max-chars 240]
           [--max-tokens 16] [--out-dir /tmp/score-vs-gen] [--threads N]

Builds `--rows` (prompt, completion) pairs from ShareGPT's first exchanges (the user's first
message and the assistant's reply, each cut to `--max-chars` characters so the run fits on a
laptop), writes them as one Parquet shard, then runs two jobs through `batchgen run` in child
processes, one after the other: `task: score` over the pairs, and a generation job over the same
prompts (`max_tokens` `--max-tokens`, greedy). Prints each job's wall time (the pipeline's, model
loading excluded) and tokens/s from its summary.json, and the scored tokens/s of the scoring job
(prompt and completion tokens are both prefilled; the completion's are the ones scored).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from batchgen.data.sharegpt import iter_sharegpt_conversations


def _pairs(num_rows: int, max_chars: int) -> pa.Table:
    ids: list[int] = []
    prompts: list[str] = []
    completions: list[str] = []
    for _, messages in iter_sharegpt_conversations():
        if len(messages) < 2:
            continue
        ids.append(len(ids))
        prompts.append(messages[0]["content"][:max_chars])
        completions.append(messages[1]["content"][:max_chars])
        if len(ids) == num_rows:
            break
    if len(ids) < num_rows:
        raise SystemExit(f"ShareGPT holds only {len(ids)} usable first exchanges")
    return pa.table({"id": ids, "prompt": prompts, "completion": completions})


def _run(job: dict[str, Any], path: Path, threads: int | None) -> dict[str, Any]:
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    argv = [sys.executable, "-m", "batchgen", "run", str(path), "--quiet", "--restart"]
    if threads:
        argv += ["--threads", str(threads)]
    subprocess.run(argv, check=True)
    summary: dict[str, Any] = json.loads((path.parent / job["output"]["path"] / "summary.json").read_text())
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--max-chars", type=int, default=240)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out-dir", default="/tmp/score-vs-gen")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    out = Path(args.out_dir)
    (out / "in").mkdir(parents=True, exist_ok=True)
    pq.write_table(_pairs(args.rows, args.max_chars), out / "in" / "pairs.parquet")
    engine = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
    score = _run(
        {"task": "score", "input": {"path": "in", "columns": {"id": "id", "prompt": "prompt", "completion": "completion"}},
         "output": {"path": "out-score"}, "engine": engine},
        out / "score.yaml", args.threads,
    )
    generate = _run(
        {"input": {"path": "in", "columns": {"id": "id", "prompt": "prompt"}}, "output": {"path": "out-generate"},
         "sampling": {"max_tokens": args.max_tokens, "temperature": 0.0}, "engine": engine},
        out / "generate.yaml", args.threads,
    )
    print(f"{'job':<10}{'rows':>7}{'ok':>7}{'wall s':>8}{'pipeline s':>11}{'prompt tok':>11}{'prefilled':>10}"
          f"{'output tok':>11}{'prompt tok/s':>13}")
    for name, summary in (("score", score), ("generate", generate)):
        tokens, rows = summary["tokens"], summary["rows"]
        # a scoring row's "prompt" is its prompt and completion, prefilled together
        print(f"{name:<10}{rows['total']:>7}{rows['by_status'].get('ok', 0):>7}{summary['wall_s']:>8.1f}"
              f"{summary['pipeline_s']:>11.1f}{tokens['prompt']:>11}{tokens['prefill_computed']:>10}"
              f"{tokens['output']:>11}{tokens['prompt'] / summary['pipeline_s']:>13.1f}")


if __name__ == "__main__":
    main()
