"""Scheduler limits and preemption order, on the fake KV-pool model of test_scheduler_kv_reads
(whose `Engine.run` asserts after every step that at most max_num_seqs sequences run and that
each preemption took the newest admission)."""

from __future__ import annotations

import pytest

from tests.engine.test_scheduler_kv_reads import Request, run_workload


@pytest.mark.parametrize("max_seqs", [1, 2, 3])
def test_forked_samples_respect_max_num_seqs(max_seqs: int) -> None:
    requests = [Request([1, 2, 3, 4, 5, 6], 5, n=4), Request([1, 2, 3, 4, 9], 3, n=2)]
    outs, engine = run_workload(requests, caching=True, num_blocks=40, block_size=4, budget=None,
                                max_seqs=max_seqs)
    assert engine.max_num_running == max_seqs
    assert outs == [r.expected() for r in requests]


def test_preemption_takes_the_newest_admission() -> None:
    # Three prompts of 6 tokens that grow to 14: 4 blocks each, 8 blocks in the pool.
    requests = [Request([i, 2, 3, 4, 5, 6], 8) for i in (1, 7, 8)]
    outs, engine = run_workload(requests, caching=False, num_blocks=8, block_size=4, budget=None, max_seqs=3)
    assert engine.num_victims == engine.sched.stats().num_preemptions >= 1
    assert outs == [r.expected() for r in requests]
