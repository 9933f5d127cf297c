"""`batchgen.ray.pool.WorkerPool` over a scripted fake Ray on a fake clock (tests/ray/fake_ray.py):
start and stall deadlines, failed actors killed before their replacement, a slot out of starts,
node loss and a shut-down connection ending the run with `ClusterLostError`, a refused start
(another model on the node) stopping it with InputError. The property test draws whole
clusters of misbehaving actors: whatever they do, the run ends within a bound computed from the
timeouts, every shard is done exactly once or the run ends with a JobError, and the fake saw no
wait without a timeout, no shard given to an actor that had not started, no replacement before
the kill. No Ray needed: the fake stands in for the module.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.io import InputError
from batchgen.job.config import RayConfig
from batchgen.job.stages import JobError, ShardMeta
from batchgen.ray.pool import ClusterLostError, PoolWorker, WorkerPool
from tests.ray.fake_ray import DETECT_S, ActorPlan, FakeRay

CONFIG = RayConfig(
    num_workers=2, num_cpus_per_worker=0.5, max_retries=1, worker_start_timeout_s=60, worker_stall_timeout_s=120
)
POLL_S = 0.5


def make_shards(count: int) -> list[ShardMeta]:
    return [
        ShardMeta(
            index=i,
            name=f"part-{i}.parquet",
            num_rows=10,
            input_path=f"in/part-{i}.parquet",
            id_type=pa.int64(),
            passthrough=pa.schema([]),
        )
        for i in range(count)
    ]


@dataclass
class Run:
    done: list[str] = field(default_factory=list)
    attempts: Counter[str] = field(default_factory=Counter)
    error: Exception | None = None
    workers: list[PoolWorker] = field(default_factory=list)
    iterations: int = 0


def drive(fake: FakeRay, config: RayConfig, num_shards: int, *, max_iterations: int = 20_000) -> Run:
    """The driver's loop in small (`batchgen.ray.driver._Dispatcher._run`): idle workers take
    queued shards; a failed attempt goes back to the queue until its shard is out of attempts."""
    pool = WorkerPool(fake, config, (), clock=fake.clock)
    queue = deque(make_shards(num_shards))
    run = Run()
    try:
        pool.start(min(config.num_workers, num_shards))
        while True:
            run.iterations += 1
            assert run.iterations <= max_iterations, "the loop did not end"
            for worker in pool.idle():
                if queue:
                    shard = queue.popleft()
                    run.attempts[shard.name] += 1
                    pool.submit(worker, shard)
            if not queue and not pool.busy():
                return run
            if not pool.has_workers():
                raise ClusterLostError(f"no Ray worker could be started ({pool.last_start_error})")
            for outcome in pool.poll(POLL_S):
                name = outcome.shard.name
                if outcome.result is not None:
                    run.done.append(name)
                elif run.attempts[name] > config.max_retries:
                    raise JobError(f"{name} failed {run.attempts[name]} times: {outcome.error}")
                else:
                    queue.appendleft(outcome.shard)
    except (JobError, InputError) as exc:
        run.error = exc
        return run
    finally:
        pool.stop()
        run.workers = pool.workers()


def kill_before_replacement(fake: FakeRay, run: Run) -> None:
    """Each actor replacing another in its slot was created after that one was killed."""
    index = {(what, number): i for i, (what, number, _) in reversed(list(enumerate(fake.events)))}
    by_slot: dict[int, list[PoolWorker]] = {}
    for worker in run.workers:
        by_slot.setdefault(worker.slot, []).append(worker)
    for workers in by_slot.values():
        for old, new in itertools.pairwise(workers):
            assert old.state == "dead", (old, new)
            assert index[("kill", old.number)] < index[("create", new.number)], fake.events


def test_healthy_workers_do_every_shard_once() -> None:
    fake = FakeRay()
    run = drive(fake, CONFIG, 5)
    assert run.error is None and sorted(run.done) == [f"part-{i}.parquet" for i in range(5)]
    assert len(run.done) == 5 and fake.violations == []
    # 2 workers start at 1.0 and take 2 s a shard: 5 shards are done at 7.0.
    assert fake.now == 7.0
    assert [w.state for w in run.workers] == ["idle", "idle"]
    assert [e for e in fake.events if e[0] == "kill"] == [("kill", 0, 7.0), ("kill", 1, 7.0)]  # by stop


def test_a_worker_that_never_starts_is_killed_at_its_deadline_and_replaced() -> None:
    fake = FakeRay([ActorPlan(start="hang")])
    config = RayConfig(num_workers=1, max_retries=1, worker_start_timeout_s=60)
    run = drive(fake, config, 2)
    assert run.error is None and run.done == ["part-0.parquet", "part-1.parquet"]
    # Killed at the first poll past 60 s, replaced at the next poll, at once.
    assert fake.events[:3] == [("create", 0, 0.0), ("kill", 0, 60.5), ("create", 1, 60.5)]
    assert run.workers[0].fate == "it did not start within ray.worker_start_timeout_s (60 s)"
    assert run.workers[0].figures()["state"] == "died" and fake.violations == []


def test_a_slot_out_of_starts_ends_the_run() -> None:
    fake = FakeRay([ActorPlan(start="hang"), ActorPlan(start="die", start_s=5.0)])
    config = RayConfig(num_workers=1, max_retries=1, worker_start_timeout_s=60)
    run = drive(fake, config, 3)
    assert isinstance(run.error, ClusterLostError)
    assert str(run.error) == (
        "no Ray worker could be started (worker 1: it died while starting: actor 1 died)"
    )
    assert fake.now == 65.5 and len(fake.actors) == 2 and run.done == []
    assert fake.violations == []


@pytest.mark.parametrize("progress", ["frozen", "silent"])
def test_a_stalled_worker_is_declared_dead_and_its_shard_retried(progress: str) -> None:
    fake = FakeRay([ActorPlan(run="hang", progress=progress)])
    config = RayConfig(num_workers=1, max_retries=1, worker_stall_timeout_s=120)
    run = drive(fake, config, 1)
    assert run.error is None and run.done == ["part-0.parquet"]
    assert run.attempts == {"part-0.parquet": 2}
    # Given its shard at 1.0, no progress since: dead at the first poll past 121.0.
    assert ("kill", 0, 121.5) in fake.events and ("create", 1, 121.5) in fake.events
    assert run.workers[0].fate == "no result and no progress for ray.worker_stall_timeout_s (120 s)"
    kill_before_replacement(fake, run)
    assert fake.violations == []


def test_a_worker_that_keeps_moving_is_not_declared_dead() -> None:
    fake = FakeRay([ActorPlan(run_s=500.0)])
    config = RayConfig(num_workers=1, worker_stall_timeout_s=120)
    run = drive(fake, config, 1)
    assert run.error is None and run.done == ["part-0.parquet"] and fake.now == 501.0
    assert len(fake.actors) == 1


def test_node_loss_ends_the_run_with_one_cluster_error() -> None:
    """The incident: the node's Ray processes die with 2 of 6 shards done; the actors' tasks
    fail once Ray marks the node dead, no replacement can be placed: the run ends at once."""
    fake = FakeRay(lose_nodes_at=4.0)
    run = drive(fake, CONFIG, 6)
    assert isinstance(run.error, ClusterLostError)
    assert run.error.reason == "no node of the Ray cluster is alive"
    assert sorted(run.done) == ["part-0.parquet", "part-1.parquet"]
    assert fake.now == 4.0 + DETECT_S  # no wait after the loss is seen
    assert len(fake.actors) == 2 and fake.violations == []


def test_a_connection_shut_down_meanwhile_ends_the_run() -> None:
    fake = FakeRay(shutdown_at=4.0)
    run = drive(fake, CONFIG, 6)
    assert isinstance(run.error, ClusterLostError)
    assert run.error.reason == "the connection to the Ray cluster was shut down"
    assert fake.now == 4.0 and fake.violations == []


def test_a_worker_with_another_model_stops_the_run_with_an_input_error() -> None:
    fake = FakeRay([ActorPlan(), ActorPlan(start="refuse")])
    run = drive(fake, CONFIG, 4)
    assert type(run.error) is InputError
    assert str(run.error) == "job.yaml: the Ray worker on host fake-host (pid 1001) differs"
    assert run.done == [] and fake.violations == []


def test_a_start_that_raises_counts_as_a_failed_start() -> None:
    fake = FakeRay([ActorPlan(start="crash")])
    config = RayConfig(num_workers=1, max_retries=1)
    run = drive(fake, config, 1)
    assert run.error is None and run.done == ["part-0.parquet"]
    assert run.workers[0].fate == "its start failed: RuntimeError: engine exploded"
    kill_before_replacement(fake, run)


_PLANS = st.builds(
    ActorPlan,
    start=st.sampled_from(["ok", "ok", "hang", "die", "crash"]),
    start_s=st.sampled_from([0.5, 3.0, 90.0]),
    run=st.sampled_from(["ok", "ok", "hang", "die", "raise"]),
    run_s=st.sampled_from([0.5, 4.0, 200.0]),
    progress=st.sampled_from(["moving", "frozen", "silent"]),
).filter(lambda p: not (p.run == "hang" and p.progress == "moving"))  # that one is working, slowly


@settings(max_examples=300)
@given(
    plans=st.lists(_PLANS, max_size=10),
    num_workers=st.integers(1, 3),
    num_shards=st.integers(1, 5),
    max_retries=st.integers(0, 2),
    lose_nodes_at=st.none() | st.sampled_from([2.0, 50.0]),
    shutdown_at=st.none() | st.sampled_from([3.0, 70.0]),
)
def test_whatever_the_actors_do_the_run_ends_in_bounded_time(
    plans: list[ActorPlan],
    num_workers: int,
    num_shards: int,
    max_retries: int,
    lose_nodes_at: float | None,
    shutdown_at: float | None,
) -> None:
    config = RayConfig(
        num_workers=num_workers, max_retries=max_retries, worker_start_timeout_s=60, worker_stall_timeout_s=120
    )
    fake = FakeRay(plans, lose_nodes_at=lose_nodes_at, shutdown_at=shutdown_at)
    run = drive(fake, config, num_shards)
    assert fake.violations == []
    # Each shard attempt, each failed and each good start lasts at most the longest deadline
    # (or run) plus a kill's wait and a poll; nothing runs in parallel in this bound.
    attempts = num_shards * (max_retries + 1)
    starts = (num_workers + attempts) * (max_retries + 2)
    bound = (attempts + starts) * (max(config.worker_stall_timeout_s, 200.0) + 10.0 + POLL_S) + DETECT_S
    assert fake.now <= bound
    if run.error is None:
        assert sorted(run.done) == [f"part-{i}.parquet" for i in range(num_shards)]
    else:
        assert isinstance(run.error, JobError), run.error
        assert len(run.done) == len(set(run.done))
    kill_before_replacement(fake, run)
    if fake.is_initialized():  # stop() killed every actor
        assert {n for what, n, _ in fake.events if what == "kill"} == set(range(len(fake.actors)))
