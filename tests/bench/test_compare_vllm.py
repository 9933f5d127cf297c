"""The comparison's table (jobs/bench/compare_vllm.py), from round files as the engines write them:
medians per engine, the ratio of the medians, every round's ratio, the fewest exact matches."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "jobs" / "bench" / "compare_vllm.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare_vllm", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_round(out: Path, tag: str, ours: float, theirs: float, tokens: dict[str, list[int]], peer: dict[str, list[int]]) -> None:
    (out / f"{tag}.batchgen.json").write_text(json.dumps({"results": [{"output_tokens_per_s": ours}]}))
    (out / f"{tag}.vllm.json").write_text(json.dumps({"output_tokens_per_s": theirs}))
    for name, ids in (("batchgen", tokens), ("vllm", peer)):
        lines = [json.dumps({"request_id": r, "token_ids": t}) for r, t in ids.items()]
        (out / f"{tag}.{name}.jsonl").write_text("\n".join(lines) + "\n")


def test_table_reports_medians_each_round_and_fewest_matches(tmp_path: Path) -> None:
    compare = _load()
    mine = {"a": [1, 2], "b": [3], "c": [4, 5]}
    # round 2's vLLM output differs on one request; round 3 is the loaded outlier
    _write_round(tmp_path, "single-turn.r1", 300.0, 200.0, mine, mine)
    _write_round(tmp_path, "single-turn.r2", 330.0, 250.0, mine, {**mine, "b": [9]})
    _write_round(tmp_path, "single-turn.r3", 150.0, 240.0, mine, mine)
    table = compare._table(tmp_path, ["single-turn"], 3).splitlines()
    assert len(table) == 2
    cells = table[1].split()
    # medians 300 and 240 -> 1.25x; rounds 1.50, 1.32, 0.62; fewest matches 2 of 3
    assert cells[:4] == ["single-turn", "300.0", "240.0", "1.25x"]
    assert cells[4:7] == ["1.50", "1.32", "0.62"]
    assert cells[7] == "2/3"


def test_table_fails_loudly_on_a_missing_round(tmp_path: Path) -> None:
    compare = _load()
    mine = {"a": [1]}
    _write_round(tmp_path, "multi-turn.r1", 100.0, 80.0, mine, mine)
    with pytest.raises(FileNotFoundError):
        compare._table(tmp_path, ["multi-turn"], 2)
