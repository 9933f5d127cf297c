"""The engine's greedy steps: while every request in flight is plain greedy, a step asks its runner
for greedy tokens only (`ModelRunner.execute_greedy`, the model's bfloat16-screened LM head where
it has one) and gets the very tokens the logits path gives; anything that needs more of the
logits (sampling, processors, log-probabilities, prompt scores) takes the logits path."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.kernels import linear_cpu
from batchgen.kernels.greedy_cpu import greedy_int8_supported
from batchgen.models.checkpoint import load_checkpoint
from tests.tiny_models import make_tiny_hf_folder

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [10, 11, 12], [13, 14, 15, 16, 17], [5, 6, 7, 8, 9, 30, 31, 32, 33]]
screen_here = linear_cpu.batchgen_linear_panel() > 0 and (linear_cpu.batchgen_bf16_linear() or greedy_int8_supported())


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("greedy"), num_layers=2, hidden_size=64, seed=3)


@pytest.fixture
def batchgen_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's linear layers on batchgen's kernel (on an Intel CPU MKL is the default), so
    that its LM head is screened where the CPU has bfloat16 dot products."""
    if linear_cpu.batchgen_linear_panel():
        monkeypatch.setattr(linear_cpu, "packed_linear_library", lambda: "batchgen")


def _run(folder: Path, params: list[SamplingParams]) -> tuple[list[list[tuple[int, ...]]], Counter[str]]:
    engine = LLMEngine(
        load_checkpoint(folder),
        scheduler_config=SchedulerConfig(max_num_seqs=3),
        cache_config=CacheConfig(),
        runner_config=RunnerConfig(device="cpu"),
    )
    model = engine.runner.model
    calls: Counter[str] = Counter()
    for name in ("forward", "greedy_tokens"):
        run = getattr(model, name)

        def counted(*args: object, _run: object = run, _name: str = name) -> object:
            calls[_name] += 1
            return _run(*args)  # type: ignore[operator]

        setattr(model, name, counted)
    ids = [engine.add_request(p, sp) for p, sp in zip(PROMPTS, params, strict=True)]
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step()})
    calls["has_greedy_head"] = int(model.has_greedy_head)
    return [[c.token_ids for c in outs[i].outputs] for i in ids], calls


def _greedy(**extra: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **extra)  # type: ignore[arg-type]


@pytest.mark.usefixtures("batchgen_head")
def test_greedy_steps_give_the_logits_paths_tokens(folder: Path) -> None:
    tokens, calls = _run(folder, [_greedy() for _ in PROMPTS])
    assert calls["greedy_tokens"] > 0 and calls["forward"] == 0
    assert calls["has_greedy_head"] == int(screen_here)
    # The same requests asking for log-probabilities need the logits: every step computes them.
    with_logprobs, calls = _run(folder, [_greedy(logprobs=0) for _ in PROMPTS])
    assert calls["greedy_tokens"] == 0 and calls["forward"] > 0
    assert tokens == with_logprobs
    assert all(len(set(t[0])) > 1 for t in tokens)  # not one token repeated: a real comparison


@pytest.mark.skipif(not screen_here or "mkl" not in linear_cpu.packing_libraries(), reason="needs the screen and MKL")
def test_the_head_is_screened_where_the_projections_use_another_library(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MKL's projections (the choice on an Intel CPU without AVX-512) with the screen this CPU has:
    # the head alone is packed for batchgen's kernel, which the screen checks its candidates with.
    from batchgen.models import decoder, mlp

    for module in (linear_cpu, decoder, mlp):
        monkeypatch.setattr(module, "packed_linear_library", lambda: "mkl")
    engine = LLMEngine(
        load_checkpoint(folder), scheduler_config=SchedulerConfig(), cache_config=CacheConfig(),
        runner_config=RunnerConfig(device="cpu"),
    )
    model = engine.runner.model
    assert model.layers[0].attention.qkv.library == "mkl"
    assert model.lm_head.library == "batchgen" and model.has_greedy_head
    tokens, calls = _run(folder, [_greedy() for _ in PROMPTS])
    assert calls["has_greedy_head"] == 1 and calls["greedy_tokens"] > 0
    with_logprobs, _ = _run(folder, [_greedy(logprobs=0) for _ in PROMPTS])
    assert tokens == with_logprobs


@pytest.mark.usefixtures("batchgen_head")
def test_one_request_needing_logits_takes_the_logits_path_until_it_finishes(folder: Path) -> None:
    params = [_greedy() for _ in PROMPTS]
    params[1] = SamplingParams(temperature=0.8, seed=1, max_tokens=3, ignore_eos=True)
    tokens, calls = _run(folder, params)
    assert calls["forward"] > 0 and calls["greedy_tokens"] > 0  # before and after it finished
    alone, _ = _run(folder, [_greedy() for _ in PROMPTS])
    assert [t for i, t in enumerate(tokens) if i != 1] == [t for i, t in enumerate(alone) if i != 1]


@pytest.mark.usefixtures("batchgen_head")
def test_greedy_samples_of_one_prompt_share_its_tokens(folder: Path) -> None:
    tokens, calls = _run(folder, [_greedy(n=2) if i == 0 else _greedy() for i in range(len(PROMPTS))])
    assert calls["forward"] == 0
    single, _ = _run(folder, [_greedy() for _ in PROMPTS])
    assert tokens[0] == [single[0][0], single[0][0]] and tokens[1:] == single[1:]


@pytest.mark.parametrize(
    ("params", "score_from", "needs"),
    [
        (SamplingParams(temperature=0), None, False),
        (SamplingParams(temperature=0, n=3, max_tokens=4, stop=["x"]), None, False),
        (SamplingParams(temperature=0.5), None, True),
        (SamplingParams(temperature=0, logprobs=0), None, True),
        (SamplingParams(temperature=0, prompt_logprobs=1), None, True),
        (SamplingParams(temperature=0), 3, True),
        (SamplingParams(temperature=0, repetition_penalty=1.2), None, True),
        (SamplingParams(temperature=0, logit_bias={3: 1.0}), None, True),
        (SamplingParams(temperature=0, min_tokens=2), None, True),
        (SamplingParams(temperature=0, allowed_token_ids=[1, 2]), None, True),
        (SamplingParams(temperature=0, bad_words=["a"]), None, True),
    ],
)
def test_what_needs_the_logits(folder: Path, params: SamplingParams, score_from: int | None, needs: bool) -> None:
    # Counted when the request is added, uncounted when it finishes.
    engine = LLMEngine(
        load_checkpoint(folder), scheduler_config=SchedulerConfig(), cache_config=CacheConfig(),
        runner_config=RunnerConfig(device="cpu"),
    )
    engine.add_request(PROMPTS[0], params, score_from=score_from)
    assert engine._num_needing_logits == int(needs)
    while engine.has_unfinished():
        engine.step()
    assert engine._num_needing_logits == 0
