"""The scheduler's plain decodes as columns, and admission's bounded reserve.

Plain decodes leave `schedule` as a `DecodeBatch` (columns) and every other chunk listed; the
plans must be what one chunk per sequence gave. Admission sums the running sequences' reserve
only when a bound of it would stop admitting: with the bound switched off (the exact sum every
time, as before) every plan, block id and output must be the same, step for step.
"""

from __future__ import annotations

import random

import pytest

from batchgen.engine.config import SchedulerConfig
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.sequence import Sequence
from batchgen.engine.step_plan import ScheduledChunk, StepPlan, StepResult
from batchgen.radix import KVCacheManager
from tests.engine.test_scheduler import make, make_seq, step


def _plan_view(plan: StepPlan, kv: KVCacheManager) -> tuple[object, ...]:
    return (plan.chunks, plan.block_copies, kv.num_free_blocks, kv.num_used_blocks)


def _workload(rng: random.Random, sched: Scheduler, num_blocks: int) -> None:
    shared = [rng.randrange(1, 6) for _ in range(rng.randint(0, 9))]
    for i in range(rng.randint(2, 9)):
        prompt = shared + [rng.randrange(1, 6) for _ in range(rng.randint(1, 8))]
        sched.add(make_seq(i, prompt[: 4 * num_blocks - 28] or [1], max_tokens=rng.randint(1, 24)))


def test_bounded_reserve_changes_no_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    sums = 0
    original = Scheduler._exact_reserve

    def counted(self: Scheduler, *args: object) -> int:
        nonlocal sums
        sums += self._bound_reserve  # the sums the bounded scheduler could not avoid
        return original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Scheduler, "_exact_reserve", counted)
    for seed in range(60):
        rng = random.Random(seed)
        num_blocks = rng.randint(8, 24)
        kwargs = dict(num_blocks=num_blocks, budget=rng.choice([None, 4, 8, 32]), max_seqs=rng.randint(2, 6),
                      reserve=rng.choice([1, 4, 8, 13]))
        bounded, kv_b = make(**kwargs)  # type: ignore[arg-type]
        exact, kv_e = make(**kwargs)  # type: ignore[arg-type]
        exact._bound_reserve = False
        _workload(random.Random(seed), bounded, num_blocks)
        _workload(random.Random(seed), exact, num_blocks)
        steps = 0
        while bounded.has_unfinished() or exact.has_unfinished():
            assert _plan_view(step(bounded, kv_b), kv_b) == _plan_view(step(exact, kv_e), kv_e), seed
            steps += 1
            assert steps < 1000
        assert [bounded.get(i).token_ids for i in range(len(bounded._seqs))] == [
            exact.get(i).token_ids for i in range(len(exact._seqs))
        ]
    assert sums > 50  # the tight pools made the bound give way to the exact sum


def test_the_bound_spares_the_sum_while_the_pool_has_room(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = Scheduler._exact_reserve
    monkeypatch.setattr(Scheduler, "_exact_reserve", lambda self, *a: calls.append(1) or original(self, *a))
    # A roomy pool: the bound never stops admission, so the sum is never taken.
    sched, kv = make(num_blocks=200, budget=None, max_seqs=3, reserve=8)
    for i in range(6):
        sched.add(make_seq(i, [1 + i, 2, 3, 4, 5], max_tokens=6))
    while sched.has_unfinished():
        step(sched, kv)
    assert calls == []
    # A tight pool: the bound would stop admission, so the exact sum decides.
    sched, kv = make(num_blocks=9, budget=None, max_seqs=3, reserve=8)
    for i in range(6):
        sched.add(make_seq(i, [1 + i, 2, 3, 4, 5], max_tokens=20))
    while sched.has_unfinished():
        step(sched, kv)
    assert calls


def test_plain_decodes_come_as_columns_and_the_rest_listed() -> None:
    sched, kv = make(num_blocks=20, budget=None, max_seqs=4)
    sched.add(make_seq(0, [1, 2, 3, 4, 5], max_tokens=5))
    first = step(sched, kv)
    assert first.decodes.seq_ids == () and [c.seq_id for c in first.listed] == [0]
    sched.add(make_seq(1, [5, 4, 3], max_tokens=5))
    second = sched.schedule()
    seq0 = sched.get(0)
    # seq 0 decodes its first generated token at position 5 (table: 2 blocks of 4); seq 1's prompt is listed
    assert second.decodes.seq_ids == (0,)
    assert second.decodes.token_ids == (seq0.token_ids[-1],)
    assert second.decodes.start_pos == (5,)
    assert second.decodes.block_tables == (kv.block_table(0),)
    assert second.decodes.sample_seeds == (seq0.seed,)
    assert second.decodes.num_generated_tokens == (1,)
    assert second.chunks[0] == ScheduledChunk(0, (seq0.token_ids[-1],), 5, kv.block_table(0), 1, (seq0.seed,), 1)
    assert [c.seq_id for c in second.listed] == [1]
    assert second.num_chunks == 2 and second.num_tokens == 4


def test_a_prompt_down_to_its_last_token_is_listed_not_a_decode() -> None:
    # Seq 1's prompt is cached but for its last token: one token to compute, still a prefill
    # (its first sample is drawn there), so it is listed with its prefill counted.
    sched, kv = make(num_blocks=20, budget=None, max_seqs=4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    sched.add(make_seq(0, prompt, max_tokens=3))
    step(sched, kv)
    sched.add(make_seq(1, prompt, max_tokens=3))
    plan = sched.schedule()
    assert [c.seq_id for c in plan.listed] == [1] and plan.listed[0].token_ids == (9,)
    assert plan.decodes.seq_ids == (0,)


def test_the_bound_covers_every_sequence_with_one_token_to_compute() -> None:
    # The scheduler's bound per such sequence covers it whatever its length, limits and whether
    # its token is planned (table up to its last token) or not (its next-to-last).
    rng = random.Random(3)
    tight = 0
    for _ in range(3000):
        block_size, reserve = rng.choice([1, 2, 4, 16]), rng.randint(1, 40)
        sched, _ = make(num_blocks=4, block_size=block_size, reserve=reserve)
        prompt_len, generated = rng.randint(1, 60), rng.randint(0, 60)
        seq = make_seq(0, list(range(1, prompt_len + 1)), max_tokens=generated + rng.randint(1, 60))
        seq.token_ids += [1] * generated
        bound = sched._one_token_reserve_bound()
        for allocated in (len(seq.token_ids) - 1, len(seq.token_ids)):
            ahead = sched._blocks_ahead(seq, allocated)
            assert ahead <= bound
            tight += ahead == bound
    assert tight  # the bound is reached: it is not loose by a block


def _ending_token(tokens: list[int]) -> int:
    """A next token that is EOS (49) or the stop token 7 one time in ten each."""
    value = random.Random(hash(tuple(tokens))).randrange(20)  # ints hash alike in every process
    return {0: 49, 1: 7}.get(value, value + 10)


def _expected_end(prompt: list[int], params: SamplingParams, max_model_len: int) -> tuple[list[int], str, int | None]:
    """A sequence's tokens and end, one token at a time (its tokens depend on its own only)."""
    tokens = list(prompt)
    while True:
        token = _ending_token(tokens)
        tokens.append(token)
        if token == 49 and not params.ignore_eos:
            return tokens, "stop", None
        if token in params.stop_token_ids:
            return tokens, "stop", token
        if len(tokens) - len(prompt) >= params.max_tokens or len(tokens) >= max_model_len:
            return tokens, "length", None


def _step_as(sched: Scheduler, *, column: bool) -> StepPlan:
    plan = sched.schedule()
    sampled = {c.seq_id: tuple([_ending_token(sched.get(c.seq_id).token_ids)] * c.num_samples)
               for c in plan.chunks if c.num_samples}
    if column:
        tokens = [sampled.pop(seq_id)[0] for seq_id in plan.decodes.seq_ids]
        sched.update(plan, StepResult(sampled, decode_tokens=tokens))
    else:
        sched.update(plan, StepResult(sampled))
    return plan


def test_decode_tokens_as_a_column_make_the_same_run() -> None:
    # The simulator hands back the decodes' tokens as a column, the model runner as a dict by
    # seq id: the same tokens must make the same plans, token ids, ends and blocks. EOS, stop
    # tokens, ignore_eos, max_tokens and max_model_len all end sequences here.
    reasons: set[tuple[str | None, object]] = set()
    for seed in range(40):
        runs = []
        for column in (False, True):
            rng = random.Random(seed)
            kv = KVCacheManager(rng.randint(10, 30), 4)
            config = SchedulerConfig(max_num_seqs=rng.randint(2, 6), max_num_batched_tokens=rng.choice([None, 6, 16]),
                                     admission_reserve_tokens=rng.choice([0, 8]))
            max_model_len = rng.randint(24, 60)
            sched = Scheduler(config, kv, max_model_len=max_model_len, eos_token_ids=[49])
            expected = []
            for i in range(rng.randint(2, 8)):
                params = SamplingParams(max_tokens=rng.randint(1, 30), temperature=0,
                                        stop_token_ids=rng.choice([(), (7,)]), ignore_eos=rng.random() < 0.3)
                prompt = [rng.randrange(1, 60) for _ in range(rng.randint(1, 14))]
                expected.append(_expected_end(prompt, params, max_model_len))
                sched.add(Sequence(seq_id=i, request_id=i, sample_index=0, token_ids=prompt,
                                   num_prompt_tokens=len(prompt), params=params, seed=i))
            plans = []
            while sched.has_unfinished():
                plans.append(_plan_view(_step_as(sched, column=column), kv))
                kv.check_invariants()
                assert len(plans) < 500
            ends = [(s.token_ids, s.finish_reason, s.stop_reason) for s in sched._seqs.values()]
            assert ends == [tuple(e) for e in expected], (seed, column)
            runs.append((plans, ends))
        assert runs[0] == runs[1], seed
        reasons |= {(reason, stop) for _, reason, stop in runs[0][1]}
    assert reasons == {("stop", None), ("stop", 7), ("length", None)}


def test_a_decode_column_of_the_wrong_length_or_a_plan_built_elsewhere() -> None:
    sched, kv = make(num_blocks=20, budget=None)
    for i in range(3):
        sched.add(make_seq(i, [1 + i, 2, 3], max_tokens=5))
    step(sched, kv)  # the prompts, each drawing its first token
    plan = sched.schedule()
    assert len(plan.decodes.seq_ids) == 3
    with pytest.raises(RuntimeError, match="expected 3 decode tokens, got 2"):
        sched.update(plan, StepResult({}, decode_tokens=[5, 6]))
    # A plan equal to the last one but not it (rebuilt by a caller) reads its sequences by id.
    again = StepPlan(plan.listed, plan.block_copies, plan.decodes)
    sched.update(again, StepResult({}, decode_tokens=[5, 6, 7]))
    assert [sched.get(i).token_ids[-1] for i in range(3)] == [5, 6, 7]
    assert [sched.get(i).num_computed_tokens for i in range(3)] == [4, 4, 4]
