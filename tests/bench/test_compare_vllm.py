"""The comparison (jobs/bench/compare_vllm.py): its table, from round files as the engines write
them (medians per engine, the ratio of the medians, every round's ratio, the fewest exact
matches), and its rounds, with a stand-in for vLLM's driver: each engine runs with no process of
the other alive."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
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


# A stand-in for vLLM's python running vllm_driver.py: the same stdin/stdout protocol, a child
# process standing for the engine core that it leaves running when it exits (as a killed driver's
# engine core and worker stay), and its pids appended to OUT/peer_pids. Its token ids equal
# batchgen's, its speed is 100 out tok/s.
_FAKE_PEER = """\
import json, os, subprocess, sys
from pathlib import Path
out = Path(sys.argv[3])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(out / "peer_pids", "a") as f:
    f.write(f"{os.getpid()} {child.pid}\\n")
print("vllm ready", flush=True)
for line in sys.stdin:
    requests, tag = line.split()
    ids = {json.loads(r)["request_id"]: [1, 2] for r in Path(requests).read_text().splitlines()}
    (out / f"{tag}.vllm.jsonl").write_text("".join(json.dumps({"request_id": r, "token_ids": t}) + "\\n" for r, t in ids.items()))
    (out / f"{tag}.vllm.json").write_text(json.dumps({"output_tokens_per_s": 100.0}))
    print(f"vllm done {tag}", flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # an exited process nobody reaped (a zombie: this VM's init leaves them) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
def test_each_engine_runs_with_no_process_of_the_other_alive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compare = _load()
    peer = tmp_path / "peer.py"
    peer.write_text(_FAKE_PEER)
    python = tmp_path / "peer-python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {peer} \"$@\"\n")
    python.chmod(0o755)
    out = tmp_path / "out"
    seen: list[tuple[str, list[int]]] = []
    runs: list[str] = []

    def fake_batchgen(out_dir: Path, workload: str, tag: str, args: object, first: bool) -> None:
        pids = (out_dir / "peer_pids").read_text().split() if (out_dir / "peer_pids").exists() else []
        seen.append((tag, [int(p) for p in pids if _alive(int(p))]))
        runs.append(f"batchgen {tag}")
        if first:
            (out_dir / f"{workload}.jsonl").write_text(json.dumps({"request_id": "a", "prompt_token_ids": [5]}) + "\n")
        (out_dir / f"{tag}.batchgen.json").write_text(json.dumps({"results": [{"output_tokens_per_s": 150.0}]}))
        (out_dir / f"{tag}.batchgen.jsonl").write_text(json.dumps({"request_id": "a", "token_ids": [1, 2]}) + "\n")

    peer_run = compare._VLLM.run

    def logged_peer_run(self: object, requests: Path, tag: str) -> None:
        runs.append(f"vllm {tag}")
        peer_run(self, requests, tag)

    monkeypatch.setattr(compare, "_batchgen", fake_batchgen)
    monkeypatch.setattr(compare._VLLM, "run", logged_peer_run)
    monkeypatch.setattr(sys, "argv", ["compare_vllm.py", "--vllm-python", str(python), "--model-dir", "m",
                                      "--out-dir", str(out), "--rounds", "2"])  # fmt: skip
    assert compare.main() == 0
    # batchgen ran every workload of both rounds with no peer process alive (not even idle)
    assert [tag for tag, _ in seen] == ["single-turn.r1", "multi-turn.r1", "single-turn.r2", "multi-turn.r2"]
    assert all(alive == [] for _, alive in seen)
    # each workload's two runs back to back, batchgen first in round 1 (its run writes the
    # requests), vLLM first in round 2
    assert runs == [
        "batchgen single-turn.r1", "vllm single-turn.r1", "batchgen multi-turn.r1", "vllm multi-turn.r1",
        "vllm single-turn.r2", "batchgen single-turn.r2", "vllm multi-turn.r2", "batchgen multi-turn.r2",
    ]  # fmt: skip
    # one peer process a timed run (2 rounds x 2 workloads), and nothing of it outlives the
    # script: driver and engine core gone
    starts = [line.split() for line in (out / "peer_pids").read_text().splitlines()]
    assert len(starts) == 4
    assert not any(_alive(int(pid)) for start in starts for pid in start)
    assert json.loads((out / "multi-turn.r2.vllm.json").read_text())["output_tokens_per_s"] == 100.0
