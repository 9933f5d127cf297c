"""Model runner: owns the device, the model weights and the KV pool tensors.

Turns a StepPlan into tensors (through the pure `build_step_arrays`), applies pending KV block
copies, runs one forward pass over the flat batch and returns the logits of the tokens that
sample (`execute`), or their greedy tokens where the engine needs nothing else of those logits
(`execute_greedy`; a full-batch CPU decode step as two streams, `batchgen.engine.cpu_streams`).
It never sees a live Sequence.

`StepRunner` is what the engine calls on a runner: `ModelRunner` is the default; another
runner may be injected (`LLMEngine(runner=...)`), e.g. the simulator's, which returns the
sampled tokens itself (a `StepResult`) and runs no model.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Protocol

import torch

from batchgen.engine.cpu_streams import SPLIT_MIN_ROWS, TwoStreams
from batchgen.engine.step_arrays import PromptLogitsSpan, StepArrays, build_step_arrays
from batchgen.engine.step_plan import ScheduledChunk, StepPlan, StepResult
from batchgen.kernels import AttentionMetadata, new_kv_cache
from batchgen.models.llama import LlamaModel

__all__ = ["ModelRunner", "StepLogits", "StepRunner", "StepTokens"]


class StepLogits:
    """Logits rows (float32 [num_rows, vocab]) and the seq_id each row belongs to; with prompt
    logprobs asked, also `prompt_logits` (float32 [rows, vocab]) laid out by `prompt_spans`."""

    __slots__ = ("logits", "prompt_logits", "prompt_spans", "seq_ids")

    def __init__(
        self,
        logits: torch.Tensor,
        seq_ids: list[int],
        prompt_logits: torch.Tensor | None = None,
        prompt_spans: Sequence[PromptLogitsSpan] = (),
    ) -> None:
        self.logits = logits
        self.seq_ids = seq_ids
        self.prompt_logits = prompt_logits
        self.prompt_spans = tuple(prompt_spans)


class StepTokens:
    """The greedy token of each sampling chunk (`ModelRunner.execute_greedy`), by seq_id order."""

    __slots__ = ("seq_ids", "tokens")

    def __init__(self, tokens: list[int], seq_ids: list[int]) -> None:
        self.tokens = tokens
        self.seq_ids = seq_ids


_ForwardInputs = tuple[
    torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], AttentionMetadata, torch.Tensor
]


class StepRunner(Protocol):
    """What the engine calls on its runner, once per step."""

    def execute(self, plan: StepPlan) -> StepLogits | StepResult:
        """Compute the plan's tokens. Logits of the sampling chunks (the engine samples), or
        the sampled tokens themselves (`StepResult`, one per sample of each sampling chunk)."""
        ...


class ModelRunner:
    def __init__(self, model: LlamaModel, *, num_blocks: int, block_size: int) -> None:
        """Allocates the KV pool: per layer two tensors [num_blocks, block_size, kv_heads, head_dim],
        laid out for the model's attention backend (`new_kv_cache`)."""
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        # Decode rows from which a greedy CPU step runs as two streams, and how many did.
        self.split_min_rows = SPLIT_MIN_ROWS
        self.num_split_steps = 0
        self._streams: TwoStreams | None = None
        c = model.config
        self.kv_caches = [
            new_kv_cache(
                num_blocks,
                block_size,
                c.num_kv_heads,
                c.head_dim,
                dtype=model.dtype,
                device=model.device,
                backend=model.attention_backend,
            )
            for _ in range(c.num_layers)
        ]

    @staticmethod
    def kv_bytes_per_block(model: LlamaModel, block_size: int) -> int:
        return int(model.kv_bytes_per_token) * block_size

    @property
    def device(self) -> torch.device:
        device: torch.device = self.model.device
        return device

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks src -> dst in every layer (forked samples' partial blocks, prefix
        hits that end inside a block). Every source is read before any destination is written:
        one pair's destination may be another's source (the scheduler relies on it)."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache.index_copy_(0, dst, k_cache.index_select(0, src))
            v_cache.index_copy_(0, dst, v_cache.index_select(0, src))

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepLogits:
        """Run the plan's tokens; mutates the KV pool. Returns logits of sampling chunks."""
        arrays, inputs = self._inputs(plan)
        num_sampling = len(arrays.logits_indices)
        logits = self.model.forward(*inputs)
        if not arrays.prompt_logits_spans:
            return StepLogits(logits, arrays.sampling_seq_ids)
        return StepLogits(
            logits[:num_sampling], arrays.sampling_seq_ids, logits[num_sampling:], arrays.prompt_logits_spans
        )

    @torch.inference_mode()
    def execute_greedy(self, plan: StepPlan) -> StepTokens:
        """`execute` for a plan whose sampling chunks all take the argmax of their raw logits
        (and that asks for no prompt log-probabilities): those tokens, one per sampling chunk,
        from the model's `greedy_tokens` (the same tokens, without most of the LM head's work
        where the model screens it)."""
        streams = self._streams_for(plan)
        if streams is not None:
            return self._greedy_in_two_streams(plan, streams)
        arrays, inputs = self._inputs(plan)
        if arrays.prompt_logits_spans:
            raise ValueError("execute_greedy computes no prompt logits: this plan asks for some")
        return StepTokens(self._greedy(inputs), arrays.sampling_seq_ids)

    def _greedy(self, inputs: _ForwardInputs) -> list[int]:
        """The greedy token of each sampling row of one forward pass."""
        tokens: list[int] = self.model.greedy_tokens(self.model.final_hidden(*inputs)).tolist()
        return tokens

    def _streams_for(self, plan: StepPlan) -> TwoStreams | None:
        """The two streams where this plan runs in them (`batchgen.engine.cpu_streams`): a CPU
        decode step of at least `split_min_rows` rows, torch on two threads. (Steps with prompt
        chunks run as one: split, a 2,048-token prefill step took 1.29x as long.)"""
        if (
            plan.listed
            or len(plan.decodes.seq_ids) < self.split_min_rows
            or self.device.type != "cpu"
            or torch.get_num_threads() != 2
        ):
            return None
        if self._streams is None:
            self._streams = TwoStreams()
            weakref.finalize(self, self._streams.close)
        return self._streams if self._streams.usable else None

    def _greedy_in_two_streams(self, plan: StepPlan, streams: TwoStreams) -> StepTokens:
        """`execute_greedy` of a decode step as two halves of its rows, side by side. The cut
        balances the halves' work: a row's projections and LM head cost about what attention
        over 320 tokens of its context does (batch 256 on the 2-core EPYC: 0.41 ms a row against
        1.3 us a context token)."""
        self._apply_copies(plan)
        chunks = plan.chunks
        costs = [320 + c.start_pos for c in chunks]
        half, total, cut = 0, sum(costs), 0
        while cut < len(chunks) - 1 and 2 * (half + costs[cut]) <= total:
            half += costs[cut]
            cut += 1
        cut = max(cut, 1)
        first_arrays, first_inputs = self._arrays_and_inputs(chunks[:cut])
        second_arrays, second_inputs = self._arrays_and_inputs(chunks[cut:])
        first, second = streams.run(lambda: self._greedy(first_inputs), lambda: self._greedy(second_inputs))
        self.num_split_steps += 1
        return StepTokens(first + second, first_arrays.sampling_seq_ids + second_arrays.sampling_seq_ids)

    def _inputs(self, plan: StepPlan) -> tuple[StepArrays, _ForwardInputs]:
        """Applies the plan's block copies; the step's arrays and the forward pass's arguments."""
        self._apply_copies(plan)
        return self._arrays_and_inputs(plan.chunks)

    def _apply_copies(self, plan: StepPlan) -> None:
        self.copy_blocks([(c.src, c.dst) for c in plan.block_copies])

    def _arrays_and_inputs(self, chunks: Sequence[ScheduledChunk]) -> tuple[StepArrays, _ForwardInputs]:
        """The arrays of `chunks` and the forward pass's arguments."""
        arrays = build_step_arrays(chunks, self.block_size)
        dev = self.device

        def ints(values: list[int] | list[list[int]], dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=dev)

        meta = AttentionMetadata(
            query_start_loc=ints(arrays.query_start_loc),
            seq_lens=ints(arrays.seq_lens),
            block_tables=ints(arrays.block_tables) if arrays.block_tables else ints([[0]]),
            slot_mapping=ints(arrays.slot_mapping, torch.int64),
            query_lens_host=tuple(arrays.query_lens),
            seq_lens_host=tuple(arrays.seq_lens),
            max_query_len=max(arrays.query_lens),
            max_seq_len=max(arrays.seq_lens),
        )
        inputs = (
            ints(arrays.input_ids, torch.int64),
            ints(arrays.positions, torch.int64),
            self.kv_caches,
            meta,
            ints(arrays.logits_indices + arrays.prompt_logits_indices, torch.int64),
        )
        return arrays, inputs
