"""The LLM API on a tiny random model: prefix reuse, seeds, n samples, stops, errors."""

from __future__ import annotations

import random

import pytest

from batchgen import LLM, SamplingParams
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)
    return LLM(str(folder), seed=0, max_num_batched_tokens=256)


def rand_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 20000) for _ in range(n)]


def test_shared_prefix_is_computed_once(llm: LLM) -> None:
    rng = random.Random(3)
    prefix = rand_tokens(rng, 200)
    prompts = [prefix + rand_tokens(rng, 5 + i) for i in range(6)]
    before = llm.stats()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    after = llm.stats()
    assert outs[0].num_cached_tokens == 0
    for out in outs[1:]:
        assert out.num_cached_tokens >= 192
    prompt_tokens = sum(len(p) for p in prompts)
    computed = after["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    assert after["prompt_tokens"] - before["prompt_tokens"] == prompt_tokens
    # The prefix's 12 full blocks are computed once: everything else is at most 5 * 16 tokens more.
    assert computed <= prompt_tokens - 5 * 192
    assert after["cached_prompt_tokens"] - before["cached_prompt_tokens"] >= 5 * 192


def test_seeded_request_is_batch_independent(llm: LLM) -> None:
    rng = random.Random(5)
    target = rand_tokens(rng, 30)
    params = SamplingParams(temperature=1.0, top_p=0.95, top_k=200, seed=1234, max_tokens=24, ignore_eos=True)
    alone = llm.generate([target], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [rand_tokens(rng, rng.randint(5, 60)) for _ in range(15)]
    other_params = [
        SamplingParams(temperature=0.8, seed=i if i % 2 else None, max_tokens=rng.randint(5, 30), ignore_eos=True)
        for i in range(15)
    ]
    batch = [*others[:7], target, *others[7:]]
    batch_params = [*other_params[:7], params, *other_params[7:]]
    together = llm.generate(batch, batch_params, use_tqdm=False)[7].outputs[0].token_ids
    assert together == alone
    again = llm.generate([target], params, use_tqdm=False)[0].outputs[0].token_ids
    assert again == alone
    different = llm.generate([target], params.replace(seed=99), use_tqdm=False)[0].outputs[0].token_ids
    assert different != alone


def test_n_samples_share_prompt_blocks(llm: LLM) -> None:
    rng = random.Random(9)
    prompt = rand_tokens(rng, 37)
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    before = llm.stats()
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    after = llm.stats()
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 12 for c in out.outputs)
    assert len({c.token_ids for c in out.outputs}) > 1  # independent samples
    # the prompt is prefilled once for all four samples
    assert after["prefill_tokens_computed"] - before["prefill_tokens_computed"] == 37
    assert after["generation_tokens"] - before["generation_tokens"] == 48
    greedy = llm.generate([prompt], SamplingParams(n=2, temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert greedy[0].outputs[0].token_ids == greedy[0].outputs[1].token_ids


def test_stop_token_ids_and_stop_strings(llm: LLM) -> None:
    rng = random.Random(11)
    prompt = rand_tokens(rng, 20)
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)[0]
    tokens = free.outputs[0].token_ids
    stop_id = tokens[5]
    first = tokens.index(stop_id)
    out = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_id]), use_tqdm=False
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    assert out.token_ids == tokens[: first + 1]

    text = free.outputs[0].text
    assert len(text) > 10
    stop = text[6:9]
    out = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop]), use_tqdm=False
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]


def test_logprobs_and_length(llm: LLM) -> None:
    out = llm.generate([[1500, 1600, 1700]], SamplingParams(temperature=0, max_tokens=3, logprobs=2, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert out.logprobs is not None and len(out.logprobs) == 3
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert token in entry and entry[token] == max(entry.values())  # greedy picks the top one
        assert len(entry) == 2


def test_outputs_keep_input_order_and_text_prompts(llm: LLM) -> None:
    prompts = ["Hello there", "A much longer prompt " * 10, "x"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    assert [o.request_id for o in outs] == sorted(o.request_id for o in outs)
    assert list(outs[0].prompt_token_ids) == llm.tokenizer.encode("Hello there")


def test_chat_uses_the_template(llm: LLM) -> None:
    conv = [{"role": "user", "content": "Hi!"}]
    out = llm.chat(conv, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert out.prompt == llm.tokenizer.apply_chat_template(conv, add_generation_prompt=True)
    assert "<|im_start|>assistant" in (out.prompt or "")


def test_chat_options_keep_vllm_names(llm: LLM) -> None:
    template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% if style is defined %}[{{ style }}]{% endif %}{% endif %}"
    )
    conv = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello, I am"}]
    params = SamplingParams(temperature=0, max_tokens=2)
    opened, continued = (
        llm.chat(conv, params, use_tqdm=False, chat_template=template, chat_template_kwargs={"style": "terse"})[0],
        llm.chat(conv, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)[0],
    )
    assert opened.prompt == "<user>Hi!</user><assistant>Hello, I am</assistant><assistant>[terse]"
    assert list(opened.prompt_token_ids) == llm.tokenizer.encode(opened.prompt, add_special_tokens=False)
    # the model's own template, cut right after the final message: no end of turn
    whole = llm.tokenizer.apply_chat_template(conv, add_generation_prompt=False)
    assert continued.prompt == whole[: whole.rindex("Hello, I am") + len("Hello, I am")]
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(conv, params, use_tqdm=False, continue_final_message=True)


def test_bad_requests_raise_clear_errors(llm: LLM) -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="n must"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=[""])
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate([[10**9]], use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)
    assert not llm.engine.has_unfinished()
