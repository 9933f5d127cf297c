"""A run's decode steps taken alternately as two streams and as one: what the split saves.

usage: PYTHONPATH=. python jobs/bench/two_streams.py REQUESTS.jsonl [--min-rows 224]

REQUESTS.jsonl is a `batchgen bench --requests-out` file (token ids and max_tokens per request).
One engine runs them (greedy, the engine's defaults); step k may run as two streams (even k) and
step k + 1 may not, so each pair meets nearly the same batch, contexts and machine. Prints, over
the pairs whose first step did split, the seconds both ways and their ratio: a comparison inside
one run, free of the 4-10% by which whole runs move here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.kernels import keep_freed_memory
from batchgen.models.checkpoint import load_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requests")
    parser.add_argument("--min-rows", type=int, default=224, help="split_min_rows of the split steps")
    args = parser.parse_args()
    keep_freed_memory()
    with open(args.requests, encoding="utf-8") as f:
        requests = [json.loads(line) for line in f]
    engine = LLMEngine(
        load_checkpoint(None), scheduler_config=SchedulerConfig(), cache_config=CacheConfig(), runner_config=RunnerConfig()
    )
    for r in requests:
        engine.add_request(r["prompt_token_ids"], SamplingParams(temperature=0, max_tokens=r["max_tokens"]))
    runner = engine.runner
    steps: list[tuple[float, bool]] = []  # (seconds, whether it ran split)
    while engine.has_unfinished():
        runner.split_min_rows = args.min_rows if len(steps) % 2 == 0 else 1 << 62
        before = runner.num_split_steps
        start = time.perf_counter()
        engine.step()
        steps.append((time.perf_counter() - start, runner.num_split_steps > before))
    pairs = [(steps[i][0], steps[i + 1][0]) for i in range(0, len(steps) - 1, 2) if steps[i][1]]
    print(f"{len(steps)} steps, {sum(s for _, s in steps)} of them split")
    if pairs:
        split, one = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        median = statistics.median(b / a for a, b in pairs)
        print(f"{len(pairs)} pairs: split {split:.2f} s, one stream {one:.2f} s, "
              f"one / split {one / split:.3f} (median of pairs {median:.3f})")


if __name__ == "__main__":
    main()
