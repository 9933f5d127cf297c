"""The same prompts give the same greedy outputs whatever the caching, chunking or preemption."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from batchgen import LLM, SamplingParams
from batchgen.engine.runner import ModelRunner
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def workload() -> list[list[int]]:
    rng = random.Random(7)
    shared = [rng.randrange(1000, 20000) for _ in range(21)]
    prompts = []
    for i in range(8):
        own = [rng.randrange(1000, 20000) for _ in range(rng.randint(1, 12))]
        prompts.append((shared if i % 2 == 0 else shared[:9]) + own)
    return prompts


def run(folder: Path, **options: object) -> tuple[list[list[int]], dict[str, int]]:
    llm = LLM(str(folder), seed=0, **options)  # type: ignore[arg-type]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = llm.generate(workload(), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], llm.stats()


def test_same_outputs_across_cache_chunking_and_preemption(folder: Path) -> None:
    baseline, base_stats = run(folder, enable_prefix_caching=False, max_num_batched_tokens=None)
    assert base_stats["num_preemptions"] == 0
    assert base_stats["cached_prompt_tokens"] == 0

    cached, stats = run(folder, enable_prefix_caching=True, max_num_batched_tokens=None)
    assert cached == baseline
    assert stats["cached_prompt_tokens"] > 0
    assert stats["prefill_tokens_computed"] < base_stats["prefill_tokens_computed"]

    for budget in (8, 64):
        outs, _ = run(folder, enable_prefix_caching=True, max_num_batched_tokens=budget)
        assert outs == baseline, f"max_num_batched_tokens={budget}"
        outs, _ = run(folder, enable_prefix_caching=False, max_num_batched_tokens=budget)
        assert outs == baseline, f"max_num_batched_tokens={budget}, no prefix cache"

    # A pool of 16 blocks of 4 tokens (one max_model_len sequence) for 8 sequences of up to 57.
    outs, stats = run(
        folder, block_size=4, num_kv_blocks=16, max_model_len=64, max_num_batched_tokens=16, admission_reserve_tokens=0
    )
    assert stats["num_preemptions"] >= 10
    assert outs == baseline
    assert stats["peak_kv_blocks_used"] <= 16
    # The same pool with the admission watermark (the default): fewer preemptions, same outputs.
    outs, watermarked = run(folder, block_size=4, num_kv_blocks=16, max_model_len=64, max_num_batched_tokens=16)
    assert watermarked["num_preemptions"] < stats["num_preemptions"]
    assert outs == baseline


def test_static_batching_gives_the_same_outputs(folder: Path) -> None:
    baseline, _ = run(folder, max_num_batched_tokens=None)
    static, _ = run(folder, batching="static", max_num_seqs=3)
    assert static == baseline


def test_bf16_linear_layers_give_bit_identical_logprobs_across_batch_and_chunking(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # batchgen's bfloat16 kernel sums each output in one chain in k order, as the float32 one, so
    # a token's logprob (not only its argmax) is the same bits whatever rows share its steps: the
    # prefix cache on or off, whole prompts or chunks of 8 tokens, one request at a time. (On a CPU
    # with AMX the opt-in runs oneDNN instead, which makes no such promise: forced here.)
    import batchgen.models.mlp
    from batchgen.kernels import linear_cpu

    if not linear_cpu.batchgen_bf16_linear():
        pytest.skip("batchgen's bfloat16 kernel needs AVX512-BF16")
    for module in (linear_cpu, batchgen.models.mlp):
        monkeypatch.setattr(module, "bf16_linear_library", lambda: "batchgen")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)

    def logprobs(**options: object) -> list[list[float]]:
        llm = LLM(str(folder), seed=0, linear_dtype="bfloat16", **options)  # type: ignore[arg-type]
        outs = llm.generate(workload(), params, use_tqdm=False)
        rows = []
        for o in outs:
            ids, lps = o.outputs[0].token_ids, o.outputs[0].logprobs or []
            rows.append([lp[t] for lp, t in zip(lps, ids, strict=True)])
        return rows

    baseline = logprobs(enable_prefix_caching=False, max_num_batched_tokens=None)
    assert len(baseline) == 8 and all(len(r) == 12 for r in baseline)
    assert logprobs(enable_prefix_caching=True, max_num_batched_tokens=None) == baseline
    assert logprobs(enable_prefix_caching=False, max_num_batched_tokens=8) == baseline
    assert logprobs(enable_prefix_caching=True, max_num_seqs=1) == baseline


def test_partial_block_hits_give_the_same_logprobs_as_computing_the_tokens(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prompts that share tokens with a finished one past its full blocks (16 tokens each): the
    # shared tokens of the next block are copied from the cached block, not computed, and every
    # logprob is the same bits as with the prefix cache off.
    rng = random.Random(3)
    shared = [rng.randrange(1000, 20000) for _ in range(21)]
    first = shared + [rng.randrange(1000, 20000) for _ in range(11)]  # 2 full blocks
    later = [
        shared + [rng.randrange(1000, 20000) for _ in range(6)],  # block 0 hit, 5 tokens of block 1
        shared[:9] + [rng.randrange(1000, 20000) for _ in range(6)],  # 9 tokens of block 0
        first[:27],  # block 0 hit; 10 tokens of block 1, but the block is gone (below)
    ]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    copies: list[list[tuple[int, int]]] = []
    copy_blocks = ModelRunner.copy_blocks

    def recorded(runner: ModelRunner, pairs: list[tuple[int, int]]) -> None:
        copies.append(list(pairs))
        copy_blocks(runner, pairs)

    monkeypatch.setattr(ModelRunner, "copy_blocks", recorded)

    def logprobs(outs: list) -> list[list[float]]:  # type: ignore[type-arg]
        return [[lp[t] for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids, strict=True)] for o in outs]

    llm = LLM(str(folder), seed=0)
    llm.generate([first], params, use_tqdm=False)
    outs = llm.generate(later, params, use_tqdm=False)
    # The three are admitted in one step. The first copies block 1 (first's second block) into
    # its own block 2; the second's own block is then block 1 itself (a CPU pool reuses written
    # blocks before new memory, cached ones included), into which it copies 9 tokens of block
    # 0: the step's copies read every source before they write, so the first still gets block
    # 1's old KV. The third finds block 1 evicted and computes from token 16.
    assert [pairs for pairs in copies if pairs] == [[(1, 2), (0, 1)]]
    assert [o.num_cached_tokens for o in outs] == [21, 9, 16]
    reference = LLM(str(folder), seed=0, enable_prefix_caching=False).generate(later, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in reference]
    assert logprobs(outs) == logprobs(reference)
