"""The stage runner of `batchgen gpu-check`: stages one after another, each in its own `try`, the
report file rewritten before and after every stage.

A device lease is short and may end mid-run (a command limit, an out-of-memory kill), so nothing a
stage measured may depend on a later stage finishing:

    report on disk:  | header | stage 1 ok | stage 2 failed: error text | stage 3 running ... |

- A stage that raises (ImportError included) is recorded as "failed" with the exception's type,
  text and traceback; the stages after it still run. Nothing is swallowed: the error is the
  stage's result, and the exit code says a stage failed.
- A stage whose `requires` did not all end "ok" is "skipped" with the reason; so is one that a
  budget in seconds leaves too little time for (`min_s`).
- KeyboardInterrupt (and the like) marks the stage "interrupted", writes the report and goes on
  up.

Owns the report's "stages" entries and the file's writes (atomic: a temporary file, then a
rename). Plain Python; imports nothing of batchgen.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Budget", "Stage", "StageReport", "StageResult", "run_stages", "write_json"]


@dataclass(slots=True)
class Budget:
    """Seconds the whole check may take (None: no limit), counted from construction on `clock`."""

    total_s: float | None
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.clock()

    def elapsed_s(self) -> float:
        return self.clock() - self.start

    def left_s(self) -> float | None:
        return None if self.total_s is None else self.total_s - self.elapsed_s()


class StageResult(NamedTuple):
    """What a stage returns: whether its figures pass, and the figures (JSON-serialisable)."""

    ok: bool
    figures: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Stage:
    """One step of the check. `run` returns its StageResult; `requires` names earlier stages that
    must have ended "ok"; `min_s` is the least time (seconds) worth starting it with."""

    name: str
    run: Callable[[], StageResult]
    requires: tuple[str, ...] = ()
    min_s: float = 0.0
    skip_reason: str | None = None  # known before the run (a missing file, package or device)


@dataclass(slots=True)
class StageReport:
    """The report being written: a fixed header and one entry per stage, in run order."""

    path: Path
    header: dict[str, Any]
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {**self.header, "stages": self.stages}

    def record(self, name: str, entry: Mapping[str, Any]) -> None:
        """Set stage `name`'s entry and rewrite the file."""
        self.stages[name] = dict(entry)
        write_json(self.path, self.as_dict())

    def status(self, name: str) -> str | None:
        entry = self.stages.get(name)
        return None if entry is None else str(entry["status"])


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """Write `payload` as indented JSON, atomically (a killed run leaves the previous version)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _error_entry(exc: BaseException, elapsed_s: float) -> dict[str, Any]:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {
        "status": "failed",
        "seconds": round(elapsed_s, 3),
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(lines)[-4000:],
    }


def run_stages(
    stages: Sequence[Stage],
    report: StageReport,
    *,
    budget: Budget | None = None,
    log: Callable[[str], None] = print,
) -> bool:
    """Run `stages` in order, recording each in `report` (rewritten before and after each one).

    Returns True when every stage that ran ended "ok" and none failed; skipped stages do not count
    against it unless a failure caused them. Re-raises BaseExceptions other than Exception after
    recording the stage as "interrupted".
    """
    budget = budget or Budget(None)
    clock = budget.clock
    all_ok = True
    for stage in stages:
        left_s = budget.left_s()
        reason = stage.skip_reason
        missing = [r for r in stage.requires if report.status(r) != "ok"]
        if reason is None and missing:
            states = ", ".join(f"{r}: {report.status(r) or 'not run'}" for r in missing)
            reason = f"needs stage(s) that did not end ok ({states})"
        if reason is None and left_s is not None and left_s < stage.min_s:
            reason = f"{left_s:.0f} s of the budget left, the stage needs at least {stage.min_s:.0f} s"
        if reason is not None:
            log(f"[{stage.name}] skipped: {reason}")
            report.record(stage.name, {"status": "skipped", "reason": reason})
            if missing and any(report.status(r) == "failed" for r in missing):
                all_ok = False
            continue
        log(f"[{stage.name}] running" + ("" if left_s is None else f" ({left_s:.0f} s of the budget left)"))
        started = {"started_after_s": round(budget.elapsed_s(), 3)}
        report.record(stage.name, {"status": "running", **started})
        t0 = clock()
        try:
            ok, figures = stage.run()
        except Exception as exc:  # recorded as the stage's result; later stages still run
            entry = _error_entry(exc, clock() - t0)
            log(f"[{stage.name}] failed: {entry['error']}")
            report.record(stage.name, {**entry, **started})
            all_ok = False
            continue
        except BaseException as exc:
            report.record(stage.name, {**_error_entry(exc, clock() - t0), "status": "interrupted", **started})
            raise
        status = "ok" if ok else "failed"
        all_ok = all_ok and ok
        log(f"[{stage.name}] {status} in {clock() - t0:.1f} s")
        report.record(stage.name, {"status": status, "seconds": round(clock() - t0, 3), **started, **figures})
    return all_ok
