"""Iteration-level scheduler: which sequences run how many tokens in the next step.

Owns the waiting and running queues, the token budget and preemption; the only writer of
`Sequence` fields. Pure Python: it talks to the KV blocks through `KVCacheManager` and hands the
runner a frozen `StepPlan`, never a live sequence.

One step, under `max_num_batched_tokens` and `max_num_seqs`:
1. running decodes (one token each), oldest admission first;
2. running sequences still prefilling, a chunk each (a long prompt spans several steps);
3. waiting sequences, admitted in order while the free blocks, after counting prefix-cache hits,
   cover their first chunk.
With `enable_chunked_prefill` off a prefill is never cut: a sequence's remaining prompt is
scheduled whole when it fits what is left of the budget, or as the step's first prefill (which
may pass the budget); otherwise it waits (running) or stops admission (waiting).
When a running sequence needs a block and none is free, the newest admitted sequence is
preempted by recompute: its blocks are freed and it returns to the head of the queue; on return
its prompt plus generated tokens are prefilled again (mostly from the prefix cache).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from batchgen.engine.config import SchedulerConfig
from batchgen.engine.sequence import Sequence, SequenceStatus
from batchgen.engine.step_plan import DecodeBatch, ScheduledChunk, StepPlan, StepResult
from batchgen.radix import BlockCopy, KVCacheManager

__all__ = ["Scheduler", "SchedulerStats"]


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    num_preemptions: int
    prefill_tokens_computed: int
    cached_prompt_tokens: int
    num_waiting: int
    num_running: int


class Scheduler:
    """Continuous (or static) batching over a KV block manager.

    `add` queues sequences; `schedule` plans a step; `update` applies the step's sampled tokens;
    `finish` ends a sequence early (a stop string found by the engine); `pop_finished` lists
    the sequences finished since it was last asked.
    """

    # Admission bounds the running sequences' reserve before it sums it (see `_admit`); the
    # tests switch the bound off to show it changes no decision.
    _bound_reserve = True

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        *,
        max_model_len: int,
        eos_token_ids: Iterable[int],
    ) -> None:
        self._config = config
        self._kv = kv
        self._block_size = kv.block_size
        self._max_model_len = max_model_len
        self._eos_token_ids = frozenset(eos_token_ids)
        self._seqs: dict[int, Sequence] = {}
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in admission order: the last is preempted first
        self._pending_forks: dict[int, list[Sequence]] = {}  # parent seq_id -> children not yet started
        self._pending_copies: list[BlockCopy] = []
        self._admit_counter = 0
        self._num_preemptions = 0
        self._prefill_tokens_computed = 0
        self._cached_prompt_tokens = 0
        # The last plan and its plain decodes' sequences, so that `update` of that plan need not
        # look each one up.
        self._last_plan: StepPlan | None = None
        self._last_decodes: list[Sequence] = []
        self._finished: list[Sequence] = []  # finished since `pop_finished`, in order

    # ----------------------------------------------------------------- queue
    def add(self, seq: Sequence, children: Iterable[Sequence] = ()) -> None:
        """Queue a new sequence; `children` are the other samples of its request, started by
        forking it once its first token is drawn. Raises ValueError if it cannot fit at all."""
        if seq.num_tokens >= self._max_model_len:
            raise ValueError(
                f"prompt of {seq.num_tokens} tokens does not fit max_model_len={self._max_model_len}"
            )
        if seq.seq_id in self._seqs:
            raise ValueError(f"sequence {seq.seq_id} was already added")
        self._seqs[seq.seq_id] = seq
        kids = list(children)
        for s in (seq, *kids):
            stop = s.params.stop_token_ids
            s.end_token_ids = self._eos_token_ids.union(stop) if stop else self._eos_token_ids
            s.max_num_tokens = min(s.num_prompt_tokens + s.params.max_tokens, self._max_model_len)
        for child in kids:
            self._seqs[child.seq_id] = child
        if kids:
            self._pending_forks[seq.seq_id] = kids
        self._waiting.append(seq)

    def get(self, seq_id: int) -> Sequence:
        return self._seqs[seq_id]

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_preemptions=self._num_preemptions,
            prefill_tokens_computed=self._prefill_tokens_computed,
            cached_prompt_tokens=self._cached_prompt_tokens,
            num_waiting=len(self._waiting),
            num_running=len(self._running),
        )

    # -------------------------------------------------------------- schedule
    def schedule(self) -> StepPlan:
        """Plan the next step; mutates queues, sequences and block tables."""
        budget = self._config.max_num_batched_tokens
        remaining = budget if budget is not None else 1 << 62
        running = SequenceStatus.RUNNING
        preempted = False
        # The last plan's forward pass ran: the blocks it cached hold their KV.
        self._kv.mark_written()

        # Sequences with one token to compute (decodes, and prompts down to their last token)
        # go first, oldest admission first, a token each while the budget lasts; their blocks
        # are grown in one call per run of sequences that fit.
        ones = [s for s in self._running if len(s.token_ids) - s.num_computed_tokens == 1]
        rest: list[Sequence] = []
        if len(ones) < len(self._running):  # most steps: decodes only
            rest = [s for s in self._running if len(s.token_ids) - s.num_computed_tokens != 1]
        kv = self._kv
        planned_ones: list[Sequence] = []
        while ones and remaining:
            batch = ones[:remaining]
            num_fit = kv.allocate_running([s.seq_id for s in batch], [len(s.token_ids) for s in batch])
            planned_ones += batch if num_fit == len(batch) else batch[:num_fit]
            remaining -= num_fit
            if num_fit == len(batch):
                break
            # No block for batch[num_fit]: preempt the newest until it fits (or is the newest).
            # A victim is never planned yet here: the newest comes last in this order.
            seq = batch[num_fit]
            while not kv.allocate(seq.seq_id, seq.num_computed_tokens + 1):
                victim = self._running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                planned_ones.append(seq)
                remaining -= 1
            ones = [s for s in ones[num_fit + 1 :] if s.status is running]
        planned: dict[int, int] = {}  # seq_id -> tokens of the other sequences, in plan order
        for seq in rest:
            if remaining == 0:
                break
            if seq.status is not running:
                continue  # preempted earlier in this loop
            num_new = self._num_new(len(seq.token_ids) - seq.num_computed_tokens, remaining, planned)
            if num_new == 0:
                continue  # chunked prefill off: this prompt waits for a step with room
            while not kv.allocate(seq.seq_id, seq.num_computed_tokens + num_new):
                victim = self._running[-1]
                if victim.seq_id in planned:
                    remaining += planned.pop(victim.seq_id)
                elif any(s is victim for s in planned_ones):
                    planned_ones.remove(victim)
                    remaining += 1
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                planned[seq.seq_id] = num_new
                remaining = remaining - num_new if num_new < remaining else 0
        # Only now is the set of running sequences final: a block filled by this step enters the
        # prefix cache once nothing can preempt its sequence before the forward pass writes its
        # KV (a victim's blocks stay cached when freed, and a later prompt would read them).
        # (A sequence with one token to compute has computed all but its last: the step makes
        # its computed count its length.)
        planned_tokens = [s.token_ids for s in planned_ones]
        kv.cache_running_blocks([s.seq_id for s in planned_ones], planned_tokens, list(map(len, planned_tokens)))
        seqs = self._seqs
        for seq_id, num_new in planned.items():
            seq = seqs[seq_id]
            kv.cache_blocks(seq_id, seq.token_ids, seq.num_computed_tokens + num_new)

        # Admission never preempts, so an admitted sequence's blocks are cached at once (a later
        # prompt of this step may take them from the cache).
        if not preempted and self._can_admit():
            remaining = self._admit(planned, planned_ones, rest, remaining)

        # A plain decode: its one token follows a computed prompt (no prefill to count, no
        # forks or prompt logits pending). The others are listed chunk by chunk.
        decodes = [s for s in planned_ones if s.num_computed_tokens >= s.num_prefill_tokens]
        listed: list[ScheduledChunk] = []
        if len(decodes) < len(planned_ones):
            listed = [self._chunk(s, 1) for s in planned_ones if s.num_computed_tokens < s.num_prefill_tokens]
        listed += [self._chunk(seqs[seq_id], n) for seq_id, n in planned.items()]
        batch_ids = tuple([s.seq_id for s in decodes])
        decode_batch = DecodeBatch(
            batch_ids,
            tuple([s.token_ids[-1] for s in decodes]),
            tuple([s.num_computed_tokens for s in decodes]),
            kv.block_tables(batch_ids),
            tuple([s.seed for s in decodes]),
            tuple([len(s.token_ids) - s.num_prompt_tokens for s in decodes]),
        )
        copies = tuple(self._pending_copies)
        self._pending_copies.clear()
        plan = StepPlan(tuple(listed), copies, decode_batch)
        self._last_plan, self._last_decodes = plan, decodes
        return plan

    def _num_new(self, num_todo: int, remaining: int, planned: dict[int, int]) -> int:
        """Tokens to schedule of a sequence with `num_todo` left to compute: as many as the budget
        leaves (chunked prefill), or, with chunking off, all of them or none (0: it waits). With
        chunking off a step's first prefill always runs whole, past the budget if it must."""
        if num_todo <= remaining or self._config.enable_chunked_prefill:
            return min(num_todo, remaining)
        has_prefill = any(n > 1 for n in planned.values())
        return 0 if has_prefill else num_todo

    def _can_admit(self) -> bool:
        if self._config.batching == "static":
            return not self._running  # a static batch runs to completion before the next
        return True

    def _blocks_ahead(self, seq: Sequence, num_allocated_tokens: int) -> int:
        """Blocks `seq` still needs beyond the `num_allocated_tokens` its table covers, to finish
        its prompt and grow `admission_reserve_tokens` past it (or to its end, if nearer)."""
        end = min(
            seq.num_prompt_tokens + seq.params.max_tokens,
            self._max_model_len,
            len(seq.token_ids) + self._config.admission_reserve_tokens,
        )
        # Blocks covering n tokens: ceil(n / block_size), written out (this runs for every running
        # sequence in every step that may admit).
        size = self._block_size
        ahead: int = -(-end // size) + num_allocated_tokens // -size
        return max(0, ahead)

    def _admit(
        self, planned: dict[int, int], planned_ones: list[Sequence], rest: list[Sequence], remaining: int
    ) -> int:
        static = self._config.batching == "static"
        watermark = not static and self._config.admission_reserve_tokens > 0
        # Watermark: a sequence is admitted only if the blocks left free afterwards still cover
        # the near-term growth of every running sequence and of itself. Admitting past that
        # point fills the pool with prompts whose decodes then preempt each other (recompute
        # thrash) when the pool is small.
        #
        #   pool:  | held by running | reserved: their next blocks | free for admission |
        #
        # The exact reserve is a sum over every running sequence; it is computed only when an
        # upper bound of it would stop admission (the same decisions, and none of that work
        # while the pool has room): a sequence with one token to compute holds its blocks up
        # to at least its next-to-last token, so it needs at most 1 + ceil(reserve / block)
        # more; the others are counted exactly.
        reserve = 0
        exact = True
        reserving = watermark and self._waiting and len(self._running) < self._config.max_num_seqs
        if reserving and not self._bound_reserve:
            reserve = self._exact_reserve(len(self._running), planned, planned_ones)
        elif reserving:
            # `rest`: the running sequences with more than one token to compute, as `schedule`
            # found them (nothing was preempted, so they are still running and unchanged).
            blocks_ahead = self._blocks_ahead
            for s in rest:
                reserve += blocks_ahead(s, s.num_computed_tokens + planned.get(s.seq_id, 0))
            num_ones = len(self._running) - len(rest)
            reserve += num_ones * self._one_token_reserve_bound()
            exact = num_ones == 0
        num_before = len(self._running)
        reserve_admitted = 0  # the reserve of the sequences admitted below
        while self._waiting and len(self._running) < self._config.max_num_seqs:
            if remaining == 0 and not static:
                break
            seq = self._waiting[0]
            # Take at most all but the last token from cache: the last one must be computed to
            # give the logits of the next token. Past the full blocks, a cached block may hold
            # the next few tokens: they are copied into the prompt's first own block.
            cacheable = seq.token_ids[: self._max_cached_tokens(seq)]
            hit = self._kv.match_prefix(cacheable)
            partial = self._kv.match_partial(hit, cacheable)
            num_cached = hit.num_tokens + (0 if partial is None else partial.num_tokens)
            num_new = self._num_new(seq.num_tokens - num_cached, remaining, planned)
            if num_new == 0 and not static:
                break  # chunked prefill off: the prompt waits for a step with room (FIFO)
            own = self._blocks_ahead(seq, num_cached + num_new) if watermark else 0
            if self._running and watermark:
                needed = self._kv.num_blocks_needed(num_cached + num_new) - len(hit.block_ids)
                if not exact and self._kv.num_free_blocks - needed < reserve + own:
                    reserve = self._exact_reserve(num_before, planned, planned_ones) + reserve_admitted
                    exact = True
                if self._kv.num_free_blocks - needed < reserve + own:
                    break
            if not self._kv.allocate(seq.seq_id, num_cached + num_new, hit):
                break
            if partial is not None:
                dst = self._kv.block_table(seq.seq_id)[len(hit.block_ids)]
                self._pending_copies.append(BlockCopy(src=partial.block_id, dst=dst))
            reserve += own
            reserve_admitted += own
            self._waiting.popleft()
            self._start(seq, num_cached)
            if num_new > 0:
                planned[seq.seq_id] = num_new
                remaining = max(0, remaining - num_new)
            self._kv.cache_blocks(seq.seq_id, seq.token_ids, seq.num_computed_tokens + num_new)
        return remaining

    def _one_token_reserve_bound(self) -> int:
        """Most blocks a running sequence with one token to compute can still need (its table
        reaches at least its next-to-last token): 1 + ceil(admission_reserve_tokens / block)."""
        bound: int = 1 + -(-self._config.admission_reserve_tokens // self._block_size)
        return bound

    def _exact_reserve(self, num_running: int, planned: dict[int, int], planned_ones: list[Sequence]) -> int:
        """Blocks the first `num_running` running sequences still need to grow
        `admission_reserve_tokens` (see `_admit`), with this step's planned tokens counted."""
        ones = {s.seq_id for s in planned_ones}
        return sum(
            self._blocks_ahead(s, s.num_computed_tokens + (1 if s.seq_id in ones else planned.get(s.seq_id, 0)))
            for s in self._running[:num_running]
        )

    @staticmethod
    def _prompt_logits_start(seq: Sequence) -> int | None:
        """The first position whose logits a sequence's prompt logprobs need (position p gives
        token p + 1's), while its prompt is still to be computed; None otherwise."""
        if seq.prompt_logprobs_start is None or seq.num_generated_tokens > 0:
            return None
        return seq.prompt_logprobs_start - 1

    def _max_cached_tokens(self, seq: Sequence) -> int:
        """Tokens a sequence may take from the prefix cache: all but its last, and none from
        the first position its prompt logprobs need (cached tokens have no logits)."""
        limit = seq.num_tokens - 1
        start = self._prompt_logits_start(seq)
        return limit if start is None else min(limit, start)

    def _start(self, seq: Sequence, num_cached: int) -> None:
        """`seq` runs, its first `num_cached` tokens served by the prefix cache."""
        seq.status = SequenceStatus.RUNNING
        seq.num_computed_tokens = num_cached
        seq.num_prefill_tokens = seq.num_tokens
        seq.admit_order = self._admit_counter
        self._admit_counter += 1
        if seq.num_cached_tokens < 0:
            seq.num_cached_tokens = num_cached
            self._cached_prompt_tokens += num_cached
        self._running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        self._running.remove(seq)
        self._kv.free(seq.seq_id)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        self._waiting.appendleft(seq)
        self._num_preemptions += 1

    def _chunk(self, seq: Sequence, num_new: int) -> ScheduledChunk:
        """The chunk of `num_new` tokens from `seq`'s first uncomputed one; counts its prefill.
        (Runs once per running sequence per step: kept lean.)"""
        start = seq.num_computed_tokens
        end = start + num_new
        token_ids = seq.token_ids
        prefill = min(end, seq.num_prefill_tokens) - start
        if prefill > 0:
            self._prefill_tokens_computed += prefill
        num_samples = 0
        seeds: tuple[int, ...] = ()
        if end == len(token_ids):
            forks = self._pending_forks.get(seq.seq_id) if self._pending_forks else None
            if forks:
                num_samples = 1 + len(forks)
                seeds = (seq.seed, *(child.seed for child in forks))
            else:
                num_samples = 1
                seeds = (seq.seed,)
        num_generated = len(token_ids) - seq.num_prompt_tokens
        return ScheduledChunk(
            seq.seq_id,
            (token_ids[start],) if num_new == 1 else tuple(token_ids[start:end]),
            start,
            self._kv.block_table(seq.seq_id),
            num_samples,
            seeds,
            num_generated,
            None if seq.prompt_logprobs_start is None else self._prompt_logits_start(seq),
        )

    # ---------------------------------------------------------------- update
    def update(
        self,
        plan: StepPlan,
        result: StepResult,
    ) -> list[Sequence]:
        """Apply a finished step: advance computed counts, append sampled tokens, end sequences
        that hit EOS, a stop token, max_tokens or max_model_len, and start forked samples.

        `result.sampled[seq_id]` holds chunk.num_samples tokens (one per sample of the request);
        the plain decodes' tokens may come instead as the column `result.decode_tokens`.
        Returns the sequences that received a token. KV copies of forked samples' partial blocks
        go into the next plan, for the runner to apply before that step's forward pass.
        """
        advanced: list[Sequence] = []
        seqs, sampled, logprobs, completed = self._seqs, result.sampled, result.logprobs, result.completed
        running = SequenceStatus.RUNNING
        # Plain decodes: `_append` written out, its end tests behind one cheap test that any
        # ending token passes (most tokens end nothing): one of `end_token_ids`, or the length
        # `max_num_tokens`.
        end_if_done = self._end_if_done
        decode_ids = plan.decodes.seq_ids
        decode_seqs = self._last_decodes if plan is self._last_plan else [seqs[seq_id] for seq_id in decode_ids]
        self._last_plan, self._last_decodes = None, []
        decode_tokens = result.decode_tokens
        if decode_tokens is None:
            decode_tokens = [self._one_token(sampled, seq_id) for seq_id in decode_ids]
        elif len(decode_tokens) != len(decode_ids):
            raise RuntimeError(f"expected {len(decode_ids)} decode tokens, got {len(decode_tokens)}")
        # A pass per field (a loop, a comprehension, a C-level map), then the end tests of the
        # few whose token may end them, in plan order.
        stale = next((seq for seq in decode_seqs if seq.status is not running), None)
        if stale is not None:
            raise RuntimeError(f"sequence {stale.seq_id} changed state during its step")
        for seq in decode_seqs:
            seq.num_computed_tokens += 1
        deque(map(list.append, [seq.token_ids for seq in decode_seqs], decode_tokens), maxlen=0)
        if logprobs:
            for seq in decode_seqs:
                token_logprobs = logprobs.get(seq.seq_id)
                if token_logprobs:
                    seq.logprobs.append(token_logprobs[0])
        ending = (
            decode_seqs
            if completed
            else [
                seq
                for seq, token in zip(decode_seqs, decode_tokens, strict=True)
                if token in seq.end_token_ids or len(seq.token_ids) >= seq.max_num_tokens
            ]
        )
        for seq in ending:
            end_if_done(seq, seq.token_ids[-1], completed)
        advanced += decode_seqs
        for chunk in plan.listed:
            seq = seqs[chunk.seq_id]
            if seq.status is not running:
                raise RuntimeError(f"sequence {seq.seq_id} changed state during its step")
            seq.num_computed_tokens += len(chunk.token_ids)
            if chunk.num_samples == 0:
                continue
            tokens = sampled[seq.seq_id]
            if len(tokens) != chunk.num_samples:
                raise RuntimeError(
                    f"expected {chunk.num_samples} tokens for sequence {seq.seq_id}, got {len(tokens)}"
                )
            token_logprobs = logprobs.get(seq.seq_id) if logprobs else None
            if chunk.num_samples > 1:
                # Fork before the parent's token is applied: the parent may finish on it.
                for i, child in enumerate(self._pending_forks.pop(seq.seq_id), start=1):
                    copy = self._fork(seq, child)
                    if copy is not None:
                        self._pending_copies.append(copy)
                    self._append(child, tokens[i], token_logprobs[i] if token_logprobs else None, completed)
                    advanced.append(child)
            self._append(seq, tokens[0], token_logprobs[0] if token_logprobs else None, completed)
            advanced.append(seq)
        return advanced

    @staticmethod
    def _one_token(sampled: Mapping[int, tuple[int, ...]], seq_id: int) -> int:
        tokens = sampled[seq_id]
        if len(tokens) != 1:
            raise RuntimeError(f"expected 1 token for sequence {seq_id}, got {len(tokens)}")
        return tokens[0]

    def _fork(self, parent: Sequence, child: Sequence) -> BlockCopy | None:
        """Start `child` sharing the parent's prompt blocks (its first token is drawn from the
        parent's logits). When `max_num_seqs` sequences already run, or no block is free for the
        partial last block, it waits instead."""
        result = None
        if len(self._running) < self._config.max_num_seqs:
            result = self._kv.fork(parent.seq_id, child.seq_id, parent.num_computed_tokens)
        if result is None:
            # No room: the child recomputes its prompt later, mostly from the prefix cache.
            child.num_cached_tokens = parent.num_cached_tokens
            self._waiting.appendleft(child)
            return None
        child.status = SequenceStatus.RUNNING
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_prefill_tokens = parent.num_prefill_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.admit_order = self._admit_counter
        self._admit_counter += 1
        self._running.append(child)
        return result.copy

    def _append(
        self, seq: Sequence, token: int, token_logprobs: dict[int, float] | None, completed: frozenset[int]
    ) -> None:
        seq.token_ids.append(token)
        if token_logprobs is not None:
            seq.logprobs.append(token_logprobs)
        self._end_if_done(seq, token, completed)

    def _end_if_done(self, seq: Sequence, token: int, completed: frozenset[int]) -> None:
        """Finish `seq` if its last token, `token`, ends it: EOS, a stop token, a complete
        grammar, max_tokens or max_model_len."""
        token_ids = seq.token_ids
        params = seq.params
        if not params.ignore_eos and token in self._eos_token_ids:
            self.finish(seq.seq_id, "stop", None)
        elif token in params.stop_token_ids:
            self.finish(seq.seq_id, "stop", token)
        elif completed and seq.seq_id in completed:  # its grammar is complete: a whole answer, not a cut one
            self.finish(seq.seq_id, "stop", None)
        elif len(token_ids) - seq.num_prompt_tokens >= params.max_tokens or len(token_ids) >= self._max_model_len:
            self.finish(seq.seq_id, "length", None)

    def finish(self, seq_id: int, reason: str, stop_reason: str | int | None) -> None:
        """End a sequence (running or waiting) and free its blocks. No-op if already finished."""
        seq = self._seqs[seq_id]
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self._running.remove(seq)
            self._kv.free(seq.seq_id)
        else:
            self._waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        self._finished.append(seq)

    def pop_finished(self) -> list[Sequence]:
        """The sequences finished since the last call, in the order they finished (the
        engine's step asks once, so that it need not look at every sequence it advanced)."""
        finished, self._finished = self._finished, []
        return finished

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence (its request has been returned)."""
        seq = self._seqs.pop(seq_id)
        if seq.status is not SequenceStatus.FINISHED:
            raise RuntimeError(f"sequence {seq_id} released before it finished")
