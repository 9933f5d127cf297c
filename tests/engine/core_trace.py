"""Prints every step plan of a fixed workload, one JSON line each: the compiled-core test runs it
once with the Python core and once with the compiled one and compares the lines.

    python tests/engine/core_trace.py [CORE_FOLDER]

With CORE_FOLDER (a `build_core` result) the compiled core is installed before anything imports
the engine. The first line says which core ran. The workload runs through the simulated engine
(the engine's own scheduler, KV manager and radix cache; a cost model instead of a model) in
four configurations: continuous batching, static batching, chunked prefill off, prefix caching
off. Each has a pool small enough to preempt, prompts that share prefixes, two samples per
request (forks) for some, stop tokens, ignore_eos and requests arriving while others run.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

if len(sys.argv) > 1:
    from batchgen.engine.compiled_core import install_core

    install_core(Path(sys.argv[1]))

from batchgen.engine.compiled_core import is_core_compiled
from batchgen.engine.config import engine_configs
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.step_plan import StepPlan, StepResult
from batchgen.sim.engine import build_sim_engine, load_sim_model
from batchgen.sim.hardware import load_hardware
from batchgen.sim.lengths import Filler, LengthDistribution

ROUNDS: dict[str, dict[str, Any]] = {
    "continuous": {},
    "static": {"batching": "static"},
    "no-chunking": {"enable_chunked_prefill": False},
    "no-prefix-cache": {"enable_prefix_caching": False},
}


def _plan_record(plan: StepPlan, engine: Any) -> dict[str, Any]:
    stats = engine.scheduler.stats()
    cache = engine.kv.stats()
    d = plan.decodes
    return {
        "listed": [[c.seq_id, c.start_pos, list(c.token_ids), list(c.block_table), c.num_samples,
                    list(c.sample_seeds), c.num_generated_tokens, c.prompt_logits_start] for c in plan.listed],
        "decodes": [list(d.seq_ids), list(d.token_ids), list(d.start_pos), [list(t) for t in d.block_tables],
                    list(d.sample_seeds), list(d.num_generated_tokens)],
        "copies": [[c.src, c.dst] for c in plan.block_copies],
        "stats": [stats.num_preemptions, stats.prefill_tokens_computed, stats.cached_prompt_tokens,
                  stats.num_waiting, stats.num_running],
        "kv": [engine.kv.num_free_blocks, engine.kv.num_used_blocks, cache.num_hit_tokens, cache.num_evictions],
    }


def _requests(rng: random.Random, count: int) -> list[tuple[list[int], SamplingParams]]:
    prefixes = [[rng.randrange(100, 5000) for _ in range(rng.randrange(16, 70))] for _ in range(4)]
    requests = []
    for i in range(count):
        prompt = [*rng.choice(prefixes), *(rng.randrange(100, 5000) for _ in range(rng.randrange(1, 40)))]
        params = SamplingParams(
            n=2 if i % 5 == 0 else 1,
            max_tokens=rng.randrange(2, 40),
            temperature=0.0,
            ignore_eos=i % 7 == 0,
            stop_token_ids=(1, 3) if i % 4 == 1 else (),
        )
        requests.append((prompt, params))
    return requests


def main() -> None:
    print(json.dumps({"compiled": None}))  # filled in below, once the core is imported
    model = load_sim_model(None, model_config=Path(__file__).resolve().parents[2] / "jobs/sim/llama-3-8b.json")
    eos = model.config.eos_token_ids[0]
    for name, options in ROUNDS.items():
        rng = random.Random(7)
        configs = engine_configs({"max_num_seqs": 8, "max_num_batched_tokens": 64, "num_kv_blocks": 20,
                                  "max_model_len": 256, "admission_reserve_tokens": 0, **options})
        source = LengthDistribution([1, 3, 8, 20, 35], filler=Filler((1, 2, 3, 4, 5)), eos=eos)
        sim = build_sim_engine(model, configs, load_hardware("h100-sxm"), source)
        engine, execute = sim.engine, sim.runner.execute
        records: list[dict[str, Any]] = []

        def recorded(plan: StepPlan) -> StepResult:
            records.append(_plan_record(plan, engine))  # noqa: B023 (the round's engine)
            return execute(plan)  # noqa: B023

        sim.runner.execute = recorded  # type: ignore[method-assign]
        todo = _requests(rng, 40)
        outputs = []
        while todo or engine.has_unfinished():
            for _ in range(rng.randrange(0, 4)):
                if todo:
                    prompt, params = todo.pop(0)
                    engine.add_request(prompt, params)
            for out in engine.step():
                outputs.append([out.request_id, [[list(c.token_ids), c.finish_reason] for c in out.outputs]])
            while records:
                print(json.dumps({"round": name, **records.pop(0)}))
        print(json.dumps({"round": name, "outputs": sorted(outputs)}))
    print(json.dumps({"compiled": is_core_compiled()}))


if __name__ == "__main__":
    main()
