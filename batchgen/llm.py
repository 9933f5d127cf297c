"""`LLM`: the in-process engine for lists of prompts or chat conversations (vLLM-style API)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from batchgen.engine.config import engine_configs
from batchgen.engine.llm_engine import EngineStats, LLMEngine
from batchgen.engine.outputs import RequestOutput
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.scoring import ScoreOutput, score_output
from batchgen.models.checkpoint import load_checkpoint
from batchgen.tokenizer.chat_options import ChatOptions

__all__ = ["LLM"]

PromptType = str | Sequence[int]
Conversation = Sequence[Mapping[str, Any]]


class LLM:
    """Loads a model (None: the built-in SmolLM2-135M-Instruct) and generates for many prompts.

    `model` is a Hugging Face folder or a .gguf file. Engine options keep vLLM's names.
    """

    def __init__(self, model: str | None = None, *, seed: int = 0, **engine_options: Any) -> None:
        """Engine options: any field of SchedulerConfig, CacheConfig or RunnerConfig
        (`batchgen.engine.config.ENGINE_OPTION_OWNERS`); TypeError names an unknown one."""
        config = engine_configs(engine_options)
        checkpoint = load_checkpoint(model)
        self.engine = LLMEngine.from_configs(checkpoint, config, seed=seed)
        self.checkpoint_fingerprint = checkpoint.fingerprint

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def stats(self) -> dict[str, int]:
        """Counters since the engine started; see EngineStats."""
        return self.engine.stats().as_dict()

    def engine_stats(self) -> EngineStats:
        return self.engine.stats()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order. Prompts are strings (tokenized with the
        model's special tokens) or token-id lists. Raises ValueError for a bad prompt."""
        items = _as_prompt_list(prompts)
        token_lists: list[tuple[str | None, list[int]]] = []
        texts: list[str] = [p for p in items if isinstance(p, str)]
        encoded = iter(self.engine.tokenizer.encode_batch(texts) if texts else [])
        for prompt in items:
            if isinstance(prompt, str):
                token_lists.append((prompt, list(next(encoded))))
            else:
                token_lists.append((None, [int(t) for t in prompt]))
        return self._run(token_lists, sampling_params, use_tqdm)

    def chat(
        self,
        conversations: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[RequestOutput]:
        """Render each conversation ({"role", "content"} messages) with the model's chat template
        and generate the assistant's reply.

        Chat options keep vLLM's names: `chat_template` replaces the tokenizer's template (a Jinja
        string), `chat_template_kwargs` are extra variables the template sees (JSON values, e.g.
        ``{"enable_thinking": False}``), `continue_final_message` (with `add_generation_prompt`
        False) continues the final message instead of opening a new assistant turn. Raises
        ValueError for bad options (both booleans True included) and ChatTemplateError for a
        malformed conversation or a template that fails."""
        options = ChatOptions.create(
            template=chat_template,
            template_kwargs=chat_template_kwargs,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
        if conversations and isinstance(conversations[0], Mapping):
            convs: list[Conversation] = [conversations]  # type: ignore[list-item]
        else:
            convs = list(conversations)  # type: ignore[arg-type]
        tok = self.engine.tokenizer
        token_lists: list[tuple[str | None, list[int]]] = []
        for conv in convs:
            text = tok.apply_chat_template(conv, options=options)
            token_lists.append((text, tok.encode(text, add_special_tokens=False)))
        return self._run(token_lists, sampling_params, use_tqdm)

    def score(
        self,
        prompts: PromptType | Sequence[PromptType],
        completions: PromptType | Sequence[PromptType],
        use_tqdm: bool = True,
    ) -> list[ScoreOutput]:
        """The log-likelihood of each completion given its prompt: one ScoreOutput per pair, in
        input order (a single prompt pairs with every completion). Strings are tokenized apart:
        the prompt as `generate` does (with the model's special tokens), the completion without
        special tokens, so that pairs sharing a prompt share its tokens, and its KV through the
        prefix cache. One prefill per pair, no decode.

        Not vLLM's `LLM.score` (a cross-encoder's similarity): this is a causal LM's
        log-probability of given text. Raises ValueError for an empty completion, a bad prompt
        or a pair too long for max_model_len."""
        prompt_list = _as_prompt_list(prompts)
        completion_list = _as_prompt_list(completions)
        if len(prompt_list) == 1 and len(completion_list) > 1:
            prompt_list = prompt_list * len(completion_list)
        if len(prompt_list) != len(completion_list):
            raise ValueError(
                f"got {len(prompt_list)} prompts for {len(completion_list)} completions; pass one prompt or one per completion"
            )
        prompt_ids = self._encode(prompt_list, add_special_tokens=True)
        completion_ids = self._encode(completion_list, add_special_tokens=False)
        for i, ids in enumerate(completion_ids):
            if not ids:
                raise ValueError(f"completion {i} is empty (no tokens)")
        engine = self.engine
        pairs = [p + c for p, c in zip(prompt_ids, completion_ids, strict=True)]
        for ids in pairs:  # all or nothing, as in generate
            engine.check_prompt(ids)
        params = SamplingParams(max_tokens=1, temperature=0)
        order: dict[int, int] = {}
        for i, (ids, prompt) in enumerate(zip(pairs, prompt_ids, strict=True)):
            order[engine.add_request(ids, params, score_from=len(prompt))] = i
        results: list[ScoreOutput | None] = [None] * len(pairs)
        bar = tqdm(total=len(pairs), desc="score", unit="pair", disable=not use_tqdm, dynamic_ncols=True)
        try:
            while engine.has_unfinished():
                for out in engine.step():
                    i = order[out.request_id]
                    results[i] = score_output(out, len(prompt_ids[i]))
                    bar.update(1)
        finally:
            bar.close()
        return [r for r in results if r is not None]

    def _encode(self, items: list[PromptType], *, add_special_tokens: bool) -> list[list[int]]:
        texts = [p for p in items if isinstance(p, str)]
        encoded = iter(self.engine.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens) if texts else [])
        return [list(next(encoded)) if isinstance(p, str) else [int(t) for t in p] for p in items]

    def _run(
        self,
        prompts: list[tuple[str | None, list[int]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"got {len(params_list)} sampling_params for {len(prompts)} prompts; pass one or one per prompt"
                )
        engine = self.engine
        for _, token_ids in prompts:  # all or nothing: a bad prompt must not leave others queued
            engine.check_prompt(token_ids)
        for params in params_list:  # a rejected schema too (compiled once, cached for add_request)
            if params.structured is not None:
                engine.structured.compile(params.structured)
        order: dict[int, int] = {}
        for i, ((text, token_ids), params) in enumerate(zip(prompts, params_list, strict=True)):
            order[engine.add_request(token_ids, params, prompt=text)] = i
        results: list[RequestOutput | None] = [None] * len(prompts)
        bar = tqdm(total=len(prompts), desc="generate", unit="req", disable=not use_tqdm, dynamic_ncols=True)
        start = time.perf_counter()
        first_token_count = engine.stats().generation_tokens
        try:
            while engine.has_unfinished():
                for out in engine.step():
                    results[order[out.request_id]] = out
                    bar.update(1)
                num_out = engine.stats().generation_tokens - first_token_count
                elapsed = time.perf_counter() - start
                bar.set_postfix_str(f"out {num_out / max(elapsed, 1e-9):.1f} tok/s", refresh=False)
        finally:
            bar.close()
        return [r for r in results if r is not None]


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, str):
        return [prompts]
    items: list[Any] = list(prompts)
    if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return [items]  # a single token-id list
    for i, p in enumerate(items):
        if not isinstance(p, str) and not (
            isinstance(p, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
        ):
            raise ValueError(f"prompt {i} must be a string or a list of token ids, got {type(p).__name__}")
    return items
