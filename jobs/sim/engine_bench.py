"""Time a simulation's engine thread alone (issue 24): the CPU seconds per output token of
`LLMEngine.step` on the simulated runner, without the job pipeline's other threads.

ShareGPT first turns (chat-templated, tokenized once before timing) go to a simulated engine
(an 8B Llama on `h100-sxm`, `max_num_seqs` 256, ShareGPT reply lengths), 512 kept in flight and
refilled as requests finish, as a simulation's engine thread does. Only the stepping loop is
timed (`time.thread_time`). To compare two checkouts, run it alternately under each:

    PYTHONPATH=/path/to/old python jobs/sim/engine_bench.py --rounds 1
    PYTHONPATH=. python jobs/sim/engine_bench.py --rounds 1

`--core compiled` runs the scheduler, KV manager and radix cache compiled with mypyc
(`batchgen.engine.compiled_core`, as `batchgen simulate --core`); alternate it with `--core python`.

The printed `clock` (simulated seconds) and `steps` must be equal between two checkouts whose
schedules are meant to be equal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from batchgen.cli.simulate import core_cache_root
from batchgen.engine.compiled_core import enable_core


def _core_from_argv() -> str:
    """`--core`, read before the engine is imported (the compiled core must come first)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--core", choices=["python", "compiled"], default="python")
    return str(parser.parse_known_args()[0].core)


CORE = enable_core(_core_from_argv(), core_cache_root(), quiet=False)[0]

from batchgen.data.sharegpt import iter_sharegpt_conversations  # noqa: E402
from batchgen.engine.config import engine_configs  # noqa: E402
from batchgen.engine.sampling_params import SamplingParams  # noqa: E402
from batchgen.sim.engine import build_sim_engine, load_sim_model  # noqa: E402
from batchgen.sim.hardware import load_hardware  # noqa: E402
from batchgen.sim.lengths import Filler, LengthDistribution, sharegpt_reply_lengths  # noqa: E402

_CONFIG = Path(__file__).with_name("llama-3-8b.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--core", choices=["python", "compiled"], default="python", help="the engine core to time")
    args = parser.parse_args()
    print(f"engine core: {CORE}", file=sys.stderr)
    model = load_sim_model(None, model_config=_CONFIG)
    tokenizer = model.tokenizer
    prompts: list[list[int]] = []
    for _, messages in iter_sharegpt_conversations():
        ids = tokenizer.encode_chat(messages[:1])
        if len(ids) < 7000:
            prompts.append(ids)
        if len(prompts) == args.requests:
            break
    eos = tuple(e for e in (*model.config.eos_token_ids, tokenizer.eos_token_id) if e is not None)
    lengths = sharegpt_reply_lengths(tokenizer)
    for _ in range(args.rounds):
        source = LengthDistribution(lengths, filler=Filler.for_tokenizer(tokenizer, eos), eos=eos[0])
        configs = engine_configs({"max_num_seqs": 256, "max_num_batched_tokens": 8192})
        sim = build_sim_engine(model, configs, load_hardware("h100-sxm"), source)
        engine = sim.engine
        params = SamplingParams(max_tokens=256, temperature=0.0)
        todo = list(reversed(prompts))
        in_flight = steps = out_tokens = 0
        start = time.thread_time()
        while todo or engine.has_unfinished():
            while in_flight < 512 and todo:
                engine.add_request(todo.pop(), params.with_seed(len(todo)))
                in_flight += 1
            finished = engine.step()
            steps += 1
            in_flight -= len(finished)
            out_tokens += sum(len(f.outputs[0].token_ids) for f in finished)
        cpu = time.thread_time() - start
        print(
            f"{len(prompts)} requests, {steps} steps, {out_tokens} output tokens, clock {sim.clock.now():.3f} s: "
            f"engine thread {cpu:.2f} s, {cpu / out_tokens * 1e6:.2f} us per output token"
        )


if __name__ == "__main__":
    main()
