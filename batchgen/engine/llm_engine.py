"""The engine: one step = schedule, run the model, sample, update.

Owns the request table (prompts, samples, detokenizers, latency records) and wires the
scheduler, the KV block manager, the runner and the sampler together. Counters for `stats()`
live here.

The runner and the clock can be injected: by default a `ModelRunner` over the checkpoint's
weights and `time.time`; the simulator passes a runner that returns sampled tokens from a cost
model and a simulated clock, so the same scheduler, KV manager, timeline and latency records run
without a model (the checkpoint's weights are then never read).
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter

import torch

from batchgen.engine.config import CacheConfig, EngineConfigs, RunnerConfig, SchedulerConfig
from batchgen.engine.detokenizer import IncrementalDetokenizer
from batchgen.engine.kv_sizing import profile_cuda_kv_blocks
from batchgen.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from batchgen.engine.prompt_logprobs import prompt_logprob_entries
from batchgen.engine.request_checks import check_request
from batchgen.engine.runner import ModelRunner, StepLogits, StepRunner, StepTokens
from batchgen.engine.sampler import Sampler, SampleRequest
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.seeding import derive_seed
from batchgen.engine.sequence import Sequence, SequenceStatus
from batchgen.engine.step_plan import StepPlan, StepResult
from batchgen.engine.structured.matchers import GrammarTarget
from batchgen.engine.structured.runtime import PendingMask, StructuredOutputs
from batchgen.engine.timeline import Timeline
from batchgen.kernels import is_kv_cache_lazy
from batchgen.models.checkpoint import Checkpoint
from batchgen.models.llama import LlamaModel
from batchgen.radix import KVCacheManager

__all__ = ["EngineStats", "LLMEngine"]

_seq_id_of = attrgetter("seq_id")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# CPU KV pool when no size is given: a share of the memory free at start, capped (vLLM-CPU
# asks for VLLM_CPU_KVCACHE_SPACE GiB instead). The pool's pages are committed only as blocks
# are first written (`kernels.new_kv_cache` maps them lazily), so an unused part costs nothing.
_CPU_KV_SHARE_OF_FREE = 0.25
_CPU_KV_CAP_BYTES = 4 << 30
_CPU_KV_MIN_BYTES = 256 << 20
# "Free" is the kernel's MemAvailable: free pages plus the page cache and other memory it can
# reclaim. MemFree alone (sysconf's SC_AVPHYS_PAGES) counts only idle pages, and on a machine that
# has read gigabytes of Parquet or model files much of the memory sits in the page cache: with
# about 10 GB of it and vLLM-CPU running beside, idle pages gave a 268 MB pool (364 blocks), too
# small for one sequence of max_model_len 8192, and the run stopped.
_MEMINFO = "/proc/meminfo"


def _available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None where there is no such line (not Linux,
    or a kernel before 3.14)."""
    try:
        with open(_MEMINFO, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    value, unit = line.split()[1:3]
                    return int(value) * (1024 if unit == "kB" else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_cpu_kv_bytes() -> int:
    """KV pool bytes for a CPU engine: 25% of the memory available (free or reclaimable), within
    [256 MiB, 4 GiB]."""
    free = _available_memory_bytes()
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = 4 * _CPU_KV_CAP_BYTES
    return max(_CPU_KV_MIN_BYTES, min(_CPU_KV_CAP_BYTES, int(free * _CPU_KV_SHARE_OF_FREE)))


def _needs_logits(request: _Request) -> bool:
    """Whether a request's tokens need more of the logits than their argmax: anything but plain
    greedy decoding (sampling, a logits processor or a grammar, log-probabilities, prompt
    log-probabilities or scores)."""
    p = request.params
    return not p.is_greedy or p.has_logits_processors or p.logprobs is not None or request.prompt_logprobs is not None


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters since the engine started (tokens unless named otherwise)."""

    num_steps: int
    num_preemptions: int
    prompt_tokens: int
    prefill_tokens_computed: int
    cached_prompt_tokens: int
    generation_tokens: int
    num_kv_blocks: int
    peak_kv_blocks_used: int

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(slots=True)
class _Request:
    request_id: int
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    seqs: list[Sequence]
    detokenizers: list[IncrementalDetokenizer | None]
    arrival_time: float
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # sample 0's, on the engine's clock
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    # One entry per prompt token when prompt logprobs are asked (filled as the prompt computes).
    prompt_logprobs: list[dict[int, float] | None] | None = None


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name is None:
        # bf16 matmuls are several times slower than fp32 on CPUs without AMX/AVX-512 BF16.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


class LLMEngine:
    """Generates for queued requests, a step at a time; not thread-safe (one owner thread)."""

    @classmethod
    def from_configs(cls, checkpoint: Checkpoint, configs: EngineConfigs, *, seed: int = 0) -> LLMEngine:
        return cls(
            checkpoint,
            scheduler_config=configs.scheduler,
            cache_config=configs.cache,
            runner_config=configs.runner,
            seed=seed,
        )

    def __init__(
        self,
        checkpoint: Checkpoint,
        *,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        runner_config: RunnerConfig,
        seed: int = 0,
        timeline_max_rows: int = 1024,
        runner: StepRunner | None = None,
        num_kv_blocks: int | None = None,
        clock: Callable[[], float] = time.time,
        reuse_written_blocks_first: bool | None = None,
        decode_text: bool = True,
    ) -> None:
        """runner: None builds a `ModelRunner` over the checkpoint's weights; an injected one
        (the simulator's) comes with its pool size, `num_kv_blocks` (a value found for its
        hardware; `cache_config.num_kv_blocks` when None). clock: seconds, read at each step's
        start and end and for latency records (the timeline's times come from it).
        reuse_written_blocks_first: the block pool's order (see `KVCacheManager`'s
        `is_lazily_committed`); None: as the model's KV pool is committed (a CPU pool's pages on
        first write: True), False for an injected runner. decode_text: False leaves a finished
        sample's `text` empty unless the request has stop strings (a simulation's filler tokens
        say nothing, and decoding them cost a few percent of its engine thread). Raises
        ValueError for sizes that cannot work."""
        if num_kv_blocks is not None and runner is None:
            raise ValueError("num_kv_blocks goes with an injected runner; set CacheConfig.num_kv_blocks")
        self.tokenizer = checkpoint.tokenizer
        self.model_config = checkpoint.config
        self.max_num_seqs = scheduler_config.max_num_seqs
        self._seed = seed
        self.clock = clock
        self.max_model_len = self._max_model_len(runner_config)
        block_size = cache_config.block_size
        model = None
        if runner is None:
            device = resolve_device(runner_config.device)
            model = LlamaModel(
                checkpoint.config,
                checkpoint.weights,
                device=device,
                dtype=resolve_dtype(runner_config.dtype, device),
                max_model_len=self.max_model_len,
                attention_backend=runner_config.attention_backend,
                linear_dtype=None if runner_config.linear_dtype is None else _DTYPES[runner_config.linear_dtype],
            )
        num_blocks = self._num_blocks(cache_config, scheduler_config, model, num_kv_blocks)
        self.kv = KVCacheManager(
            num_blocks,
            block_size,
            enable_prefix_caching=cache_config.enable_prefix_caching,
            hash_seed=cache_config.hash_seed,
            # A CPU pool's pages are committed as blocks are first written: reusing written
            # blocks first keeps resident KV at the peak of blocks in use (issue 25). An
            # injected runner has no pool: the device order (cached blocks kept longest) unless
            # it says otherwise (the simulator of a CPU).
            is_lazily_committed=(
                reuse_written_blocks_first
                if reuse_written_blocks_first is not None
                else model is not None and is_kv_cache_lazy(model.device)
            ),
        )
        if model is not None:
            runner = ModelRunner(model, num_blocks=num_blocks, block_size=block_size)
        assert runner is not None
        self._runner: StepRunner = runner
        eos = set(checkpoint.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.sampler = Sampler(self.eos_token_ids)
        self._device = runner.device if isinstance(runner, ModelRunner) else torch.device("cpu")
        self.structured = StructuredOutputs(
            self.tokenizer,
            vocab_size=checkpoint.config.vocab_size,
            eos_token_ids=self.eos_token_ids,
        )
        self.scheduler = Scheduler(
            scheduler_config, self.kv, max_model_len=self.max_model_len, eos_token_ids=self.eos_token_ids
        )
        self._requests: dict[int, _Request] = {}
        self._seq_to_request: dict[int, _Request] = {}
        self._num_detokenized = 0  # requests with stop strings (their samples are detokenized)
        # Requests whose tokens need more of the logits than their argmax: while there are none,
        # a step asks its runner for greedy tokens only (`ModelRunner.execute_greedy`).
        self._num_needing_logits = 0
        self._decode_text = decode_text
        # Each sequence's list of token times: sample 0's is its request's latency record, the
        # other samples share one scratch list, emptied every step (see `step`).
        self._token_times_of: dict[int, list[float]] = {}
        self._scratch_times: list[float] = []
        self._request_ids = itertools.count()
        self._seq_ids = itertools.count()
        self._num_steps = 0
        self._sampler_s = 0.0  # perf_counter seconds inside Sampler.sample (the bench reads it)
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._peak_blocks = 0
        self.timeline = Timeline(timeline_max_rows, kv_blocks_total=num_blocks)

    def _max_model_len(self, runner_config: RunnerConfig) -> int:
        config = self.model_config
        limit = config.max_position_embeddings  # sliding windows are attention's (issue 23)
        if runner_config.max_model_len is None:
            return min(limit, 32768)
        if runner_config.max_model_len > limit:
            raise ValueError(
                f"max_model_len={runner_config.max_model_len} exceeds the model's limit of {limit} tokens"
            )
        return runner_config.max_model_len

    @property
    def runner(self) -> ModelRunner:
        """The model runner; RuntimeError for an engine built with an injected runner."""
        if not isinstance(self._runner, ModelRunner):
            raise RuntimeError("this engine runs an injected runner (a simulation), not a model")
        return self._runner

    def _num_blocks(
        self, cache: CacheConfig, sched: SchedulerConfig, model: LlamaModel | None, injected: int | None
    ) -> int:
        per_seq = -(-self.max_model_len // cache.block_size)
        if model is None and injected is not None:
            num_blocks = injected
        elif cache.num_kv_blocks is not None:
            num_blocks = cache.num_kv_blocks
        elif model is None:
            raise ValueError("an engine with an injected runner needs its num_kv_blocks")
        elif model.device.type == "cuda" and cache.kv_cache_memory_bytes is None:
            num_blocks = profile_cuda_kv_blocks(
                model, sched, cache, max_model_len=self.max_model_len
            )
        else:
            block_bytes = ModelRunner.kv_bytes_per_block(model, cache.block_size)
            budget = cache.kv_cache_memory_bytes or default_cpu_kv_bytes()
            num_blocks = budget // block_bytes
            if cache.kv_cache_memory_bytes is None:
                num_blocks = min(num_blocks, sched.max_num_seqs * per_seq)
                # The default's floor is one sequence of max_model_len, where the memory available
                # holds it: the pool's pages are committed as blocks are written, so a pool above
                # a quarter of that memory costs nothing until it is used (beside vLLM-CPU's 8 GiB
                # pool, a quarter came to 414 blocks, too few for one 8,192-token sequence).
                available = _available_memory_bytes()
                if num_blocks < per_seq and (available is None or per_seq * block_bytes <= available):
                    num_blocks = per_seq
        if num_blocks < per_seq:
            raise ValueError(
                f"the KV pool ({num_blocks} blocks of {cache.block_size} tokens) cannot hold one "
                f"sequence of max_model_len={self.max_model_len} tokens; give more KV memory or a "
                f"smaller max_model_len"
            )
        return num_blocks

    # --------------------------------------------------------------- requests
    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        *,
        arrival_time: float | None = None,
        score_from: int | None = None,
    ) -> int:
        """Queue a prompt; returns its request id. `arrival_time` (engine clock seconds; default
        now) starts its latency record.

        `score_from`: compute the log-probabilities of the prompt tokens from this index on
        (`RequestOutput.prompt_logprobs`; at least 1: the first token has none); the tokens
        before it may come from the prefix cache, the others are computed. Default: 1 when
        `params.prompt_logprobs` is set (the whole prompt is computed), else none.

        Raises ValueError if it cannot fit, asks for more logprobs than the vocabulary holds,
        names token ids outside it, or bans every token it allows; `StructuredOutputError` (a
        ValueError) when the grammar engine rejects its `structured_outputs`."""
        self.check_prompt(prompt_token_ids)
        setup = check_request(
            params,
            len(prompt_token_ids),
            vocab_size=self.model_config.vocab_size,
            eos_token_ids=self.eos_token_ids,
            encode=lambda text: self.tokenizer.encode(text, add_special_tokens=False),
            score_from=score_from,
        )
        score_from = setup.score_from
        structured = params.structured
        grammar = None if structured is None else self.structured.compile(structured)
        request_id = next(self._request_ids)
        base_seed = params.seed if params.seed is not None else derive_seed(self._seed, request_id)
        seqs = [
            Sequence(
                seq_id=next(self._seq_ids),
                request_id=request_id,
                sample_index=i,
                token_ids=list(prompt_token_ids),
                num_prompt_tokens=len(prompt_token_ids),
                params=params,
                seed=derive_seed(base_seed, i),
                prompt_logprobs_start=score_from if i == 0 else None,
            )
            for i in range(params.n)
        ]
        stop = params.stop_strings
        request = _Request(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=tuple(prompt_token_ids),
            params=params,
            seqs=seqs,
            detokenizers=[self._detokenizer(params) if stop else None for _ in seqs],
            arrival_time=self.clock() if arrival_time is None else arrival_time,
            bad_words_token_ids=setup.bad_words_token_ids,
            prompt_logprobs=None if score_from is None else [None] * len(prompt_token_ids),
        )
        self._requests[request_id] = request
        self._num_detokenized += bool(stop)
        self._num_needing_logits += _needs_logits(request)
        for seq in seqs:
            self._seq_to_request[seq.seq_id] = request
            self._token_times_of[seq.seq_id] = request.token_times if seq.sample_index == 0 else self._scratch_times
            if grammar is not None:
                self.structured.add(seq.seq_id, grammar)
        self.scheduler.add(seqs[0], seqs[1:])
        self._prompt_tokens += len(prompt_token_ids)
        return request_id

    def _detokenizer(self, params: SamplingParams) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(
            self.tokenizer,
            params.stop_strings,
            skip_special_tokens=params.skip_special_tokens,
            min_tokens=params.min_tokens,
            include_stop_str=params.include_stop_str_in_output,
        )

    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raises ValueError if the prompt is empty, holds unknown token ids or is too long."""
        if not prompt_token_ids:
            raise ValueError("prompt is empty (no tokens)")
        vocab = self.model_config.vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
            raise ValueError(f"prompt holds token ids outside the vocabulary [0, {vocab})")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt_token_ids)} tokens leaves no room to generate within "
                f"max_model_len={self.max_model_len}"
            )

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    @property
    def num_unfinished(self) -> int:
        return len(self._requests)

    # ------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Run one step; returns the requests that finished in it."""
        t_start = self.clock()
        plan = self.scheduler.schedule()
        self._peak_blocks = max(self._peak_blocks, self.kv.num_used_blocks)
        if plan.is_empty:
            if self.scheduler.has_unfinished():
                raise RuntimeError("scheduler made no progress with work pending (KV pool too small?)")
            return []
        self._num_steps += 1
        seq_to_request = self._seq_to_request
        for chunk in plan.listed:
            # A request is first scheduled with its first sample's first chunk, before any token
            # was generated (a readmitted or forked sequence has generated one; so has every
            # plain decode, which is why only the listed chunks are looked at).
            if chunk.num_generated_tokens == 0:
                scheduled = seq_to_request[chunk.seq_id]
                if scheduled.first_scheduled_time is None:
                    scheduled.first_scheduled_time = t_start
        result = self._run(plan)
        t_tokens = self.clock()
        advanced = self.scheduler.update(plan, result)
        self._generation_tokens += len(advanced)
        finished: list[RequestOutput] = []
        # Each advanced sequence received exactly one token in this step: its time (C-level
        # passes: into sample 0's latency record, or the scratch list of the other samples),
        # then the stop strings of the requests that have them.
        token_times = map(self._token_times_of.__getitem__, map(_seq_id_of, advanced))
        deque(map(list.append, token_times, itertools.repeat(t_tokens)), maxlen=0)
        self._scratch_times.clear()
        if self._num_detokenized:
            for seq in advanced:
                detok = seq_to_request[seq.seq_id].detokenizers[seq.sample_index]
                if detok is not None:
                    matched = detok.update(seq.token_ids[-1:])
                    if seq.is_finished:
                        detok.finish()  # its stop string, if any, wins in _finish
                    elif matched is not None:
                        self.scheduler.finish(seq.seq_id, "stop", matched)
        # The requests with a sample that finished in this step, each once, in the order of
        # `advanced`: the scheduler's list of the sequences it finished is in that order; a
        # stop string ends one after the others, so with stop strings `advanced` is read again.
        ended_seqs = self.scheduler.pop_finished()
        if self._num_detokenized:
            ended_seqs = [seq for seq in advanced if seq.status is SequenceStatus.FINISHED]
        ended: dict[int, _Request] = {}
        for seq in ended_seqs:
            request = seq_to_request[seq.seq_id]
            ended[request.request_id] = request
        for request in ended.values():
            if all(s.is_finished for s in request.seqs):
                finished.append(self._finish(request))
        self._record_step(t_start, plan, len(advanced), len(finished))
        return finished

    def _record_step(self, t_start: float, plan: StepPlan, num_sampled: int, num_finished: int) -> None:
        sched, kv = self.scheduler.stats(), self.kv
        self.timeline.record_step(
            t_start=t_start,
            t_end=self.clock(),
            num_scheduled_tokens=plan.num_tokens,
            num_output_tokens=num_sampled,
            num_finished=num_finished,
            num_running=plan.num_chunks,
            num_waiting=sched.num_waiting,
            prefill_tokens_total=sched.prefill_tokens_computed,
            cached_tokens_total=sched.cached_prompt_tokens,
            preemptions_total=sched.num_preemptions,
            kv_blocks_used=kv.num_used_blocks,
            kv_blocks_cached=kv.stats().num_cached_blocks,
            kv_blocks_free=kv.num_free_blocks,
            num_context_tokens=plan.num_context_tokens,
            num_attention_pairs=plan.num_attention_pairs,
        )

    def _mask_overlaps(self) -> bool:
        """Grammar masks fill beside the forward pass when it leaves a core free: a GPU's, or a
        CPU's running on fewer threads than the machine has cores."""
        return self._device.type != "cpu" or torch.get_num_threads() < (os.cpu_count() or 1)

    def _grammar_targets(self, plan: StepPlan) -> list[GrammarTarget]:
        """The constrained sequences that draw a token in this step (at an n-sample fork, every
        sample of the request)."""
        targets: list[GrammarTarget] = []
        if not self.structured.num_constrained:
            return targets
        for chunk in plan.chunks:
            if chunk.num_samples == 0:
                continue
            seqs = self._seq_to_request[chunk.seq_id].seqs if chunk.num_samples > 1 else [self.scheduler.get(chunk.seq_id)]
            targets.extend(
                GrammarTarget(s.seq_id, s.token_ids, s.num_prompt_tokens, ignore_eos=s.params.ignore_eos)
                for s in seqs
                if self.structured.is_constrained(s.seq_id)
            )
        return targets

    def _run(self, plan: StepPlan) -> StepResult:
        if self._num_needing_logits == 0 and isinstance(self._runner, ModelRunner):
            return self._greedy_result(self._runner.execute_greedy(plan), plan)  # no grammar in flight either
        # The grammar masks are filled on a worker thread while the forward pass runs.
        grammar_targets = self._grammar_targets(plan)
        pending: PendingMask | None = (
            self.structured.start_masks(grammar_targets, overlap=self._mask_overlaps()) if grammar_targets else None
        )
        step_logits = self._runner.execute(plan)
        if isinstance(step_logits, StepResult):
            if pending is not None:
                pending.result(self._device)  # let the worker finish before the next step
            return step_logits  # an injected runner that picks the tokens itself (the simulator)
        num_samples = {c.seq_id: c.num_samples for c in plan.chunks}
        requests: list[SampleRequest] = []
        owners: list[int] = []
        for row, seq_id in enumerate(step_logits.seq_ids):
            request = self._seq_to_request[seq_id]
            seq = self.scheduler.get(seq_id)
            # At an n-sample fork all samples draw their first token from the parent's row.
            targets = request.seqs if num_samples[seq_id] > 1 else [seq]
            for target in targets:
                requests.append(
                    SampleRequest(
                        row=row,
                        params=target.params,
                        seed=target.seed,
                        token_idx=target.num_generated_tokens,
                        seq_id=target.seq_id,
                        token_ids=target.token_ids,
                        num_prompt_tokens=target.num_prompt_tokens,
                        bad_words_token_ids=request.bad_words_token_ids,
                    )
                )
                owners.append(seq_id)
        if step_logits.prompt_logits is not None:
            self._collect_prompt_logprobs(step_logits)
        grammar = None if pending is None else pending.result(step_logits.logits.device)
        sampler_start = time.perf_counter()
        result = self.sampler.sample(step_logits.logits, requests, grammar)
        self._sampler_s += time.perf_counter() - sampler_start
        completed: set[int] = set()
        if grammar is not None:
            for request_, token in zip(requests, result.token_ids, strict=True):
                if request_.seq_id is not None and self.structured.is_constrained(request_.seq_id):
                    self.structured.advance(request_.seq_id, token)
                    if self.structured.is_complete(request_.seq_id):
                        completed.add(request_.seq_id)
        sampled: dict[int, list[int]] = {}
        logprobs: dict[int, list[dict[int, float]]] = {}
        for seq_id, token, lp in zip(owners, result.token_ids, result.logprobs, strict=True):
            sampled.setdefault(seq_id, []).append(token)
            if lp is not None:
                logprobs.setdefault(seq_id, []).append(lp)
        return StepResult(
            sampled={seq_id: tuple(tokens) for seq_id, tokens in sampled.items()},
            logprobs={seq_id: tuple(lps) for seq_id, lps in logprobs.items()},
            completed=frozenset(completed),
        )

    def _greedy_result(self, step: StepTokens, plan: StepPlan) -> StepResult:
        """The step's result from its greedy tokens: each sample of a sampling chunk takes its
        row's token (at an n-sample fork every sample draws from the parent's row)."""
        num_samples = {c.seq_id: c.num_samples for c in plan.chunks}
        sampled = {
            seq_id: (token,) * (len(self._seq_to_request[seq_id].seqs) if num_samples[seq_id] > 1 else 1)
            for seq_id, token in zip(step.seq_ids, step.tokens, strict=True)
        }
        return StepResult(sampled=sampled, logprobs={}, completed=frozenset())

    def _collect_prompt_logprobs(self, step_logits: StepLogits) -> None:
        """Log-probabilities of the prompt tokens whose logits this step computed (position p's
        row gives token p + 1's), into each request's `prompt_logprobs`."""
        assert step_logits.prompt_logits is not None
        spans = step_logits.prompt_spans
        targets: list[int] = []
        requests: list[_Request] = []
        for span in spans:
            tokens = self.scheduler.get(span.seq_id).token_ids
            targets.extend(tokens[span.start_pos + 1 : span.start_pos + 1 + span.num_positions])
            requests.append(self._seq_to_request[span.seq_id])
        found = prompt_logprob_entries(
            step_logits.prompt_logits, spans, targets, [r.params.prompt_logprobs or 0 for r in requests]
        )
        for span, request, entries in zip(spans, requests, found, strict=True):
            assert request.prompt_logprobs is not None
            request.prompt_logprobs[span.start_pos + 1 : span.start_pos + 1 + span.num_positions] = entries

    def _finish(self, request: _Request) -> RequestOutput:
        outputs = []
        for seq, detok in zip(request.seqs, request.detokenizers, strict=True):
            token_ids = tuple(seq.generated_token_ids)
            if detok is not None:
                text = detok.text
            elif self._decode_text:
                text = self.tokenizer.decode(list(token_ids), skip_special_tokens=request.params.skip_special_tokens)
            else:
                text = ""
            finish_reason, stop_reason = seq.finish_reason or "length", seq.stop_reason
            if detok is not None and detok.stop_string is not None:
                # A stop string completed by a token that also ended the sequence (EOS, a stop
                # token, the length limit): the text is cut at the string, so it is the reason.
                finish_reason, stop_reason = "stop", detok.stop_string
            outputs.append(
                CompletionOutput(
                    index=seq.sample_index,
                    text=text,
                    token_ids=token_ids,
                    finish_reason=finish_reason,
                    stop_reason=stop_reason,
                    logprobs=tuple(seq.logprobs) if request.params.logprobs is not None else None,
                    seed=seq.seed,
                    grammar_completed=self.structured.is_accepting(seq.seq_id)
                    if self.structured.is_constrained(seq.seq_id)
                    else None,
                )
            )
            self.scheduler.release(seq.seq_id)
            self.sampler.release(seq.seq_id)
            self.structured.release(seq.seq_id)
            del self._seq_to_request[seq.seq_id]
            del self._token_times_of[seq.seq_id]
        del self._requests[request.request_id]
        self._num_detokenized -= request.detokenizers[0] is not None
        self._num_needing_logits -= _needs_logits(request)
        first_scheduled = request.first_scheduled_time
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            num_cached_tokens=max(0, request.seqs[0].num_cached_tokens),
            outputs=tuple(outputs),
            metrics=RequestMetrics(
                arrival_time=request.arrival_time,
                first_scheduled_time=request.arrival_time if first_scheduled is None else first_scheduled,
                token_times=tuple(request.token_times),
            ),
            prompt_logprobs=request.prompt_logprobs,
        )

    @property
    def sampler_s(self) -> float:
        """Seconds (perf_counter) spent in the sampler since the engine started: the logits
        processors, the draw and the logprobs. On CUDA it includes waiting for the step's
        kernels, since the sampled ids are copied to the host there."""
        return self._sampler_s

    def stats(self) -> EngineStats:
        sched = self.scheduler.stats()
        return EngineStats(
            num_steps=self._num_steps,
            num_preemptions=sched.num_preemptions,
            prompt_tokens=self._prompt_tokens,
            prefill_tokens_computed=sched.prefill_tokens_computed,
            cached_prompt_tokens=sched.cached_prompt_tokens,
            generation_tokens=self._generation_tokens,
            num_kv_blocks=self.kv.num_blocks,
            peak_kv_blocks_used=self._peak_blocks,
        )
