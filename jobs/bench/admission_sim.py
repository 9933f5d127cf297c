"""Admission on a small KV pool: the scheduler and block manager alone, with a fake model.

usage: PYTHONPATH=. python jobs/bench/admission_sim.py [--num-requests 512] [--max-tokens 128]

Runs the single-turn workload's exact prompts through the real Scheduler and KVCacheManager;
a fake model draws a token that is never EOS, so every request generates `--max-tokens`
tokens (the longest a greedy run can take). Prints recompute preemptions and prefill tokens
computed for the default CPU pool and one 4x smaller, with the admission watermark on and off.
"""

from __future__ import annotations

import argparse

from batchgen.data.workloads import build_workload
from batchgen.engine.config import SchedulerConfig
from batchgen.engine.llm_engine import default_cpu_kv_bytes
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.sequence import Sequence
from batchgen.engine.step_plan import StepResult
from batchgen.models.checkpoint import load_checkpoint
from batchgen.radix import KVCacheManager

_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M, float32


def simulate(prompts: list[tuple[int, ...]], num_blocks: int, reserve: int, max_tokens: int) -> dict[str, int]:
    kv = KVCacheManager(num_blocks, 16)
    sched = Scheduler(SchedulerConfig(admission_reserve_tokens=reserve), kv, max_model_len=2048, eos_token_ids=[2])
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    for i, p in enumerate(prompts):
        sched.add(Sequence(seq_id=i, request_id=i, sample_index=0, token_ids=list(p), num_prompt_tokens=len(p), params=params, seed=0))
    steps = peak_running = 0
    while sched.has_unfinished():
        plan = sched.schedule()
        steps += 1
        peak_running = max(peak_running, sched.num_running)
        sampled = {c.seq_id: (3,) * c.num_samples for c in plan.chunks if c.num_samples}
        sched.update(plan, StepResult(sampled))
        for c in plan.chunks:
            seq = sched.get(c.seq_id)
            if seq.is_finished:
                sched.release(seq.seq_id)
    stats = sched.stats()
    return {
        "steps": steps,
        "preemptions": stats.num_preemptions,
        "prefill_computed": stats.prefill_tokens_computed,
        "peak_running": peak_running,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-requests", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    tok = load_checkpoint(None).tokenizer
    requests = build_workload("single-turn", tok, num_requests=args.num_requests, max_tokens=args.max_tokens)
    prompts = [r.prompt_token_ids for r in requests]
    default_blocks = default_cpu_kv_bytes() // (_KV_BYTES_PER_TOKEN * 16)
    print(f"{len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens; every request generates {args.max_tokens}")
    print(f"{'pool blocks':>12}{'watermark':>11}{'preempt':>9}{'prefill':>9}{'steps':>7}{'peak running':>14}")
    for blocks in (default_blocks, default_blocks // 4, 1456):
        for reserve in (0, 128):
            r = simulate(prompts, blocks, reserve, args.max_tokens)
            print(f"{blocks:>12}{'on' if reserve else 'off':>11}{r['preemptions']:>9}{r['prefill_computed']:>9}"
                  f"{r['steps']:>7}{r['peak_running']:>14}")


if __name__ == "__main__":
    main()
