"""Seeded sampling gives the same tokens whether or not sequences are preempted (recompute
preemption redraws nothing: each token's noise depends only on the seed and its index)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from batchgen import LLM, SamplingParams
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def test_seeded_sampling_is_unchanged_by_preemption(folder: Path) -> None:
    rng = random.Random(11)
    shared = [rng.randrange(1000, 20000) for _ in range(13)]
    prompts = [shared[: rng.randint(0, 13)] + [rng.randrange(1000, 20000) for _ in range(rng.randint(1, 9))]
               for _ in range(8)]
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=20, ignore_eos=True,
                             n=2 if i % 3 == 0 else 1) for i in range(len(prompts))]

    def run(**options: object) -> tuple[list[list[tuple[int, ...]]], dict[str, int]]:
        llm = LLM(str(folder), seed=0, **options)  # type: ignore[arg-type]
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [[c.token_ids for c in o.outputs] for o in outs], llm.stats()

    baseline, stats = run(max_num_batched_tokens=None)
    assert stats["num_preemptions"] == 0
    # 12 blocks of 4 tokens for 11 sequences of up to 42 tokens: constant preemption.
    preempted, stats = run(block_size=4, num_kv_blocks=12, max_model_len=48, max_num_batched_tokens=16,
                           admission_reserve_tokens=0)  # admit greedily so the pool runs out
    assert stats["num_preemptions"] >= 10
    assert preempted == baseline
    assert len({tuple(t) for o in baseline for t in o}) > 1  # sampling, not a constant
