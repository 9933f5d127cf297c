"""The gpu-check stage runner with fake stages: a stage that raises is recorded and the later ones
still run, the report on disk is rewritten before and after every stage, dependents and stages the
budget cannot fit are skipped with their reason, an interrupt is recorded and goes on up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchgen.cli.gpu_stages import Budget, Stage, StageReport, StageResult, run_stages


def _on_disk(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_raising_stage_is_recorded_and_later_stages_still_run(tmp_path: Path) -> None:
    path = tmp_path / "gpu_check.json"
    report = StageReport(path, {"command": "gpu-check"})
    seen: list[dict[str, Any]] = []

    def first() -> StageResult:
        return StageResult(True, {"figure": 1})

    def second() -> StageResult:
        raise ImportError("No module named 'gguf'")

    def third() -> StageResult:
        seen.append(_on_disk(path))  # what a killed run would leave behind at this point
        return StageResult(True, {"figure": 3})

    ok = run_stages(
        [Stage("first", first), Stage("second", second), Stage("third", third)], report, log=lambda _: None
    )
    assert ok is False
    (during_third,) = seen
    assert during_third["command"] == "gpu-check"
    assert during_third["stages"]["first"]["status"] == "ok"
    assert during_third["stages"]["second"]["status"] == "failed"
    assert during_third["stages"]["second"]["error"] == "ImportError: No module named 'gguf'"
    assert during_third["stages"]["third"]["status"] == "running"
    final = _on_disk(path)
    assert [final["stages"][n]["status"] for n in ("first", "second", "third")] == ["ok", "failed", "ok"]
    assert final["stages"]["third"]["figure"] == 3
    assert "raise ImportError" in final["stages"]["second"]["traceback"]
    assert not (tmp_path / "gpu_check.json.tmp").exists()


def test_dependents_of_a_failed_stage_are_skipped_with_the_reason(tmp_path: Path) -> None:
    report = StageReport(tmp_path / "r.json", {})
    ran: list[str] = []

    def boom() -> StageResult:
        raise FileNotFoundError("model.safetensors")

    def record(name: str) -> Stage:
        def run() -> StageResult:
            ran.append(name)
            return StageResult(True, {})

        return Stage(name, run, requires=("model",))

    stages = [Stage("model", boom), record("engine"), Stage("kernels", lambda: StageResult(True, {}))]
    assert run_stages(stages, report, log=lambda _: None) is False
    assert ran == []
    engine = _on_disk(tmp_path / "r.json")["stages"]["engine"]
    assert engine == {"status": "skipped", "reason": "needs stage(s) that did not end ok (model: failed)"}
    assert report.status("kernels") == "ok"


def test_a_known_skip_is_not_a_failure_and_a_false_result_is(tmp_path: Path) -> None:
    report = StageReport(tmp_path / "r.json", {})
    stages = [
        Stage("kernels", lambda: StageResult(True, {}), skip_reason="no CUDA device is visible to torch"),
        Stage("engine", lambda: StageResult(True, {"x": 1}), requires=("kernels",)),
    ]
    assert run_stages(stages, report, log=lambda _: None) is True
    assert report.stages["kernels"] == {"status": "skipped", "reason": "no CUDA device is visible to torch"}
    assert report.stages["engine"]["reason"] == "needs stage(s) that did not end ok (kernels: skipped)"
    report2 = StageReport(tmp_path / "r2.json", {})
    assert run_stages([Stage("engine", lambda: StageResult(False, {"ok_tokens": 3}))], report2, log=lambda _: None) is False
    assert report2.stages["engine"]["status"] == "failed" and report2.stages["engine"]["ok_tokens"] == 3


def test_a_stage_the_budget_cannot_fit_is_skipped(tmp_path: Path) -> None:
    clock = FakeClock()
    report = StageReport(tmp_path / "r.json", {})

    def slow() -> StageResult:
        clock.now += 50.0
        return StageResult(True, {})

    stages = [Stage("kernels", slow), Stage("engine", slow, min_s=30.0), Stage("bench", slow, min_s=5.0)]
    assert run_stages(stages, report, budget=Budget(60.0, clock=clock), log=lambda _: None) is True
    assert report.stages["kernels"]["status"] == "ok" and report.stages["kernels"]["seconds"] == 50.0
    assert report.stages["engine"] == {
        "status": "skipped",
        "reason": "10 s of the budget left, the stage needs at least 30 s",
    }
    assert report.stages["bench"]["status"] == "ok"
    assert report.stages["bench"]["started_after_s"] == 50.0


def test_an_interrupt_is_recorded_and_raised(tmp_path: Path) -> None:
    report = StageReport(tmp_path / "r.json", {})

    def interrupted() -> StageResult:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_stages([Stage("bench", interrupted), Stage("attention", lambda: StageResult(True, {}))], report,
                   log=lambda _: None)
    stages = _on_disk(tmp_path / "r.json")["stages"]
    assert stages["bench"]["status"] == "interrupted"
    assert "attention" not in stages


_OUTCOMES = st.sampled_from(["ok", "false", "raise", "known-skip"])


@given(
    plan=st.lists(
        st.tuples(_OUTCOMES, st.lists(st.integers(min_value=0, max_value=7), max_size=2)), min_size=1, max_size=8
    )
)
def test_every_stage_is_recorded_once_in_order_whatever_its_neighbours_do(plan: list[tuple[str, list[int]]]) -> None:
    """Random stage lists (each ok, returning False, raising, or skipped up front; each needing up to
    two earlier stages): every stage gets exactly one final entry, in order; a stage runs exactly
    when it has no known skip and all it needs ended ok; the result is False exactly when a stage
    that ran did not end ok, or a stage was skipped because one it needed failed."""
    import tempfile

    ran: list[str] = []

    def make(name: str, outcome: str) -> Stage:
        def run() -> StageResult:
            ran.append(name)
            if outcome == "raise":
                raise RuntimeError(f"{name} broke")
            return StageResult(outcome == "ok", {"name": name})

        return Stage(name, run, skip_reason="known" if outcome == "known-skip" else None)

    stages = []
    for idx, (outcome, needs) in enumerate(plan):
        stage = make(f"s{idx}", outcome)
        requires = tuple(sorted({f"s{n}" for n in needs if n < idx}))
        stages.append(Stage(stage.name, stage.run, requires=requires, skip_reason=stage.skip_reason))
    with tempfile.TemporaryDirectory() as tmp:
        report = StageReport(Path(tmp) / "r.json", {"h": 1})
        ok = run_stages(stages, report, log=lambda _: None)
        assert _on_disk(report.path) == json.loads(json.dumps(report.as_dict()))
    assert list(report.stages) == [s.name for s in stages]
    expected_ok = True
    for stage, (outcome, _) in zip(stages, plan, strict=True):
        entry = report.stages[stage.name]
        needs_ok = all(report.stages[r]["status"] == "ok" for r in stage.requires)
        should_run = stage.skip_reason is None and needs_ok
        assert (stage.name in ran) == should_run
        if not should_run:
            assert entry["status"] == "skipped"
            if stage.skip_reason is None and any(report.stages[r]["status"] == "failed" for r in stage.requires):
                expected_ok = False
            continue
        assert entry["status"] == {"ok": "ok", "false": "failed", "raise": "failed"}[outcome]
        if outcome == "raise":
            assert entry["error"] == f"RuntimeError: {stage.name} broke"
        expected_ok = expected_ok and outcome == "ok"
    assert ok is expected_ok
