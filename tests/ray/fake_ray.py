"""A scripted, in-process stand-in for the `ray` module, driven by a fake clock (no tests in
here): what `batchgen.ray.pool.WorkerPool` calls (`remote`, `wait`, `get`, `kill`,
`is_initialized`, `nodes`, `exceptions`), with each actor's behaviour given by an `ActorPlan`.

Time moves only inside `wait` (to the next resolution, or by the timeout), so a pool that
waits without a bound would stop time and trip the loop guard of the tests. The fake also
checks the pool's manners and records every breach in `violations`:
- every `wait` and `get` has a timeout; `get` is asked of resolved refs only;
- `kill` is called with ``no_restart=True``; a shard goes only to an actor whose start succeeded;
- nothing is created or asked once the session is shut down.

Node loss (`lose_nodes_at`): actors alive then die `DETECT_S` later (Ray marks the node dead
after missed heartbeats); actors created after it are never placed; `nodes()` shows no node
alive. `shutdown_at`: `is_initialized` turns False, `wait` raises ValueError and `get` raises
SystemExit, as the real one does after `ray.shutdown()` from another thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from batchgen.io import InputError
from batchgen.job.stages import PipelineStats, ShardMeta
from batchgen.ray.worker import ShardResult, WorkerIdentity, WorkerProgress

__all__ = ["DETECT_S", "ActorPlan", "FakeRay"]

DETECT_S = 15.0


class RayError(Exception):
    pass


class RayTaskError(RayError):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"task raised {cause!r}")
        self.cause = cause


class ActorDiedError(RayError):
    pass


class GetTimeoutError(RayError, TimeoutError):
    pass


@dataclass(frozen=True)
class ActorPlan:
    """How one actor behaves. `start`: ok | hang (never placed) | die | refuse (InputError, as a
    fingerprint mismatch) | crash (RuntimeError); `run` (every shard): ok | hang | die | raise;
    `progress` while running: moving (rows grow) | frozen (same figures) | silent (no answer)."""

    start: str = "ok"
    start_s: float = 1.0
    run: str = "ok"
    run_s: float = 2.0
    progress: str = "moving"


@dataclass(eq=False)
class _Actor:
    number: int
    plan: ActorPlan
    created_at: float
    started: bool = False
    killed_at: float | None = None
    dies_at: float | None = None
    running: tuple[ShardMeta, float] | None = None  # shard, since when


@dataclass(eq=False)
class _Ref:
    actor: _Actor
    kind: str
    created_at: float
    ready_at: float | None  # None: never of itself
    value: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class _Method:
    fake: FakeRay
    actor: _Actor
    name: str

    def remote(self, *args: Any) -> _Ref:
        return self.fake._call(self.actor, self.name, args)


@dataclass(eq=False)
class _Handle:
    fake: FakeRay
    actor: _Actor

    def __getattr__(self, name: str) -> _Method:
        return _Method(self.fake, self.actor, name)


@dataclass(eq=False)
class _ActorClass:
    fake: FakeRay

    def options(self, **_: Any) -> _ActorClass:
        return self

    def remote(self, *_: Any) -> _Handle:
        return self.fake._create()


@dataclass
class FakeRay:
    plans: list[ActorPlan] = field(default_factory=list)
    lose_nodes_at: float | None = None
    shutdown_at: float | None = None
    now: float = 0.0
    actors: list[_Actor] = field(default_factory=list)
    events: list[tuple[str, int, float]] = field(default_factory=list)  # (what, actor, time)
    violations: list[str] = field(default_factory=list)
    num_waits: int = 0

    exceptions = SimpleNamespace(
        RayError=RayError, RayTaskError=RayTaskError, ActorDiedError=ActorDiedError, GetTimeoutError=GetTimeoutError
    )

    # --- the ray API the pool uses --------------------------------------------------------------

    def clock(self) -> float:
        return self.now

    def remote(self, _cls: type) -> _ActorClass:
        return _ActorClass(self)

    def is_initialized(self) -> bool:
        return self.shutdown_at is None or self.now < self.shutdown_at

    def nodes(self) -> list[dict[str, Any]]:
        alive = self.lose_nodes_at is None or self.now < self.lose_nodes_at
        return [{"Alive": alive, "Resources": {"CPU": 2.0}}]

    def kill(self, handle: _Handle, *, no_restart: bool = False) -> None:
        if not no_restart:
            self.violations.append(f"kill of actor {handle.actor.number} without no_restart")
        if not self.is_initialized():
            raise ValueError("actor handle from a finished session")
        actor = handle.actor
        if actor.killed_at is None:
            actor.killed_at = self.now
        self.events.append(("kill", actor.number, self.now))

    def wait(self, refs: list[_Ref], *, num_returns: int = 1, timeout: float | None = None) -> tuple[list[_Ref], list[_Ref]]:
        self.num_waits += 1
        if timeout is None:
            self.violations.append("ray.wait without a timeout")
            timeout = math.inf
        if not self.is_initialized():
            raise ValueError("Ray objects whose owner is unknown")
        deadline = self.now + timeout
        while True:
            ready = [r for r in refs if (t := self._resolved_at(r)) is not None and t <= self.now]
            if len(ready) >= num_returns or self.now >= deadline:
                break
            upcoming = [t for r in refs if (t := self._resolved_at(r)) is not None and t > self.now]
            events = [t for t in (self.lose_nodes_at, self.shutdown_at) if t is not None and t > self.now]
            step = min([*upcoming, *events, deadline])
            if math.isinf(step):
                self.violations.append("a wait that can never return")
                break
            self.now = step
            if not self.is_initialized():
                raise ValueError("Ray objects whose owner is unknown")
        ready = ready[:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: _Ref, *, timeout: float | None = None) -> Any:
        if timeout is None:
            self.violations.append("ray.get without a timeout")
        if not self.is_initialized():
            raise SystemExit(0)
        at = self._resolved_at(ref)
        if at is None or at > self.now:
            self.violations.append(f"ray.get of an unresolved {ref.kind} ref")
            self.now += timeout or 0.0
            raise GetTimeoutError("Get timed out")
        error = self._error(ref)
        if error is not None:
            raise error
        return ref.value

    # --- behaviour ------------------------------------------------------------------------------

    def _create(self) -> _Handle:
        if not self.is_initialized():
            self.violations.append("an actor created after shutdown (a real Ray would start anew)")
        number = len(self.actors)
        plan = self.plans[number] if number < len(self.plans) else ActorPlan()
        actor = _Actor(number, plan, self.now)
        self.actors.append(actor)
        self.events.append(("create", number, self.now))
        return _Handle(self, actor)

    def _placed(self, actor: _Actor) -> bool:
        return self.lose_nodes_at is None or actor.created_at < self.lose_nodes_at

    def _call(self, actor: _Actor, name: str, args: tuple[Any, ...]) -> _Ref:
        if not self.is_initialized():
            self.violations.append(f"{name}.remote() after shutdown")
        plan, now = actor.plan, self.now
        if name == "start":
            if plan.start == "hang" or not self._placed(actor):
                return _Ref(actor, name, now, None)
            ready = now + plan.start_s
            if plan.start == "die":
                actor.dies_at = ready
                return _Ref(actor, name, now, None)
            if plan.start == "ok":
                actor.started = True  # the pool may only use it once this ref resolved
                return _Ref(actor, name, now, ready, value=WorkerIdentity("fake-host", 1000 + actor.number))
            cause: BaseException = (
                InputError(f"job.yaml: the Ray worker on host fake-host (pid {1000 + actor.number}) differs")
                if plan.start == "refuse"
                else RuntimeError("engine exploded")
            )
            return _Ref(actor, name, now, ready, error=RayTaskError(cause))
        if name == "run_shard":
            (shard,) = args
            start_ref_done = actor.started and now >= actor.created_at + plan.start_s
            if not start_ref_done:
                self.violations.append(f"run_shard given to actor {actor.number} before it started")
            actor.running = (shard, now)
            if plan.run == "hang":
                return _Ref(actor, name, now, None)
            ready = now + plan.run_s
            if plan.run == "die":
                actor.dies_at = ready if actor.dies_at is None else min(actor.dies_at, ready)
                return _Ref(actor, name, now, None)
            if plan.run == "raise":
                return _Ref(actor, name, now, ready, error=RayTaskError(RuntimeError(f"bug on {shard.name}")))
            stats = PipelineStats(num_rows=shard.num_rows, output_tokens=3 * shard.num_rows)
            return _Ref(actor, name, now, ready, value=ShardResult(None, stats, plan.run_s))
        if name == "progress":
            if plan.progress == "silent" and actor.running is not None:
                return _Ref(actor, name, now, None)
            shard_name, rows = None, 0
            if actor.running is not None:
                shard, since = actor.running
                shard_name = shard.name
                rows = 0 if plan.progress == "frozen" else int(now - since) + 1
            return _Ref(actor, name, now, now, value=WorkerProgress(shard_name, rows, rows, 0.0))
        raise AttributeError(name)

    def _death(self, ref: _Ref) -> float | None:
        """When the ref's actor stops answering: killed, died of itself, or its node lost."""
        actor = ref.actor
        times = [t for t in (actor.killed_at, actor.dies_at) if t is not None]
        if self.lose_nodes_at is not None and self._placed(actor):
            times.append(self.lose_nodes_at + DETECT_S)
        return max(min(times), ref.created_at) if times else None

    def _own(self, ref: _Ref) -> float | None:
        """When the ref resolves of itself: never on a lost node (the actor's process is gone
        with it, though the driver learns of it only `DETECT_S` later)."""
        lost = self.lose_nodes_at
        if ref.ready_at is None or not self._placed(ref.actor):
            return None
        return ref.ready_at if lost is None or ref.ready_at < lost else None

    def _resolved_at(self, ref: _Ref) -> float | None:
        candidates = [t for t in (self._own(ref), self._death(ref)) if t is not None]
        return min(candidates) if candidates else None

    def _error(self, ref: _Ref) -> BaseException | None:
        own, death = self._own(ref), self._death(ref)
        if death is not None and (own is None or death < own):
            return ActorDiedError(f"actor {ref.actor.number} died")
        return ref.error
