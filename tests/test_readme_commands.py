"""The README's first command, run as a user runs it (issue 20): `batchgen prepare-sharegpt`,
then `batchgen run jobs/demo.yaml` (the real SmolLM2 model), and `python jobs/quickstart.py`.

Everything goes to a temporary folder: the demo job's input and output paths are redirected with
`--set`, and it runs on a few prepared rows with few tokens (the job file is the repository's,
unchanged). Slow: each command loads the built-in model in a child process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.job.helpers import final_shards, subprocess_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "jobs" / "demo.yaml"
_CONSOLE_SCRIPT = Path(sys.executable).with_name("batchgen")
BATCHGEN = [str(_CONSOLE_SCRIPT)] if _CONSOLE_SCRIPT.is_file() else [sys.executable, "-m", "batchgen"]


def _batchgen(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BATCHGEN, *args], cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=900, check=False
    )


def test_prepare_sharegpt_writes_the_demo_input(tmp_path: Path) -> None:
    """The README's `batchgen prepare-sharegpt jobs/data/sharegpt`, into a temporary folder:
    128 real prompts in 4 shards with the columns jobs/demo.yaml reads."""
    out = tmp_path / "sharegpt"
    proc = _batchgen("prepare-sharegpt", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote 128 prompts in 4 shards to {out}"
    shards = sorted(out.glob("*.parquet"))
    assert [p.name for p in shards] == [f"sharegpt-{s:03d}.parquet" for s in range(4)]
    tables = [pq.read_table(p) for p in shards]
    assert [t.num_rows for t in tables] == [32, 32, 32, 32]
    assert tables[0].schema.names == ["id", "messages", "chars"]
    ids = [i for t in tables for i in t.column("id").to_pylist()]
    assert len(set(ids)) == 128
    first = tables[0].column("messages").to_pylist()[0]
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"].strip()


def test_demo_job_runs_resumes_and_refuses_a_changed_config(tmp_path: Path) -> None:
    data, out = tmp_path / "sharegpt", tmp_path / "out" / "demo"
    assert _batchgen("prepare-sharegpt", str(data), "--rows", "6", "--shards", "2").returncode == 0
    redirect = ["--set", f"input.path={data}", "--set", f"output.path={out}", "--threads", "1"]
    run = _batchgen("run", str(DEMO), *redirect, "--set", "sampling.max_tokens=4", "--quiet")
    assert run.returncode == 0, run.stderr
    # One output shard per input shard, rows in input order, the side files, the report last.
    assert [p.name for p in final_shards(out)] == ["sharegpt-000.parquet", "sharegpt-001.parquet"]
    for shard in final_shards(out):
        table = pq.read_table(shard)
        source = pq.read_table(data / shard.name)
        assert table.column("id").to_pylist() == source.column("id").to_pylist()
        assert table.column("chars").to_pylist() == source.column("chars").to_pylist()  # passthrough
        assert set(table.column("finish_reason").to_pylist()) <= {"stop", "length"}
        assert all(u["completion_tokens"] <= 4 for u in table.column("usage").to_pylist())
        assert all(text for text in table.column("output").to_pylist())
    for name in ("manifest.json", "summary.json", "timeline.parquet", "report.html"):
        assert (out / name).is_file(), name
    # the README abbreviates it as `report  .../report.html`; the summary pads its label column
    assert re.fullmatch(rf"report +{re.escape(str(out / 'report.html'))}", run.stdout.strip().splitlines()[-1])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"]["by_status"] == {"ok": 6}

    # Run it again: the committed shards are skipped, their files untouched.
    before = {p.name: p.read_bytes() for p in final_shards(out)}
    again = _batchgen("run", str(DEMO), *redirect, "--set", "sampling.max_tokens=4", "--quiet")
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "summary.json").read_text())["shards"] == {"committed_this_run": 0, "skipped": 2}
    assert {p.name: p.read_bytes() for p in final_shards(out)} == before

    # Change a sampling value: refused until --restart.
    changed = _batchgen("run", str(DEMO), *redirect, "--set", "sampling.max_tokens=5", "--quiet")
    assert changed.returncode == 2, changed.stderr
    assert "--restart" in changed.stderr
    assert {p.name: p.read_bytes() for p in final_shards(out)} == before


def test_demo_job_file_is_what_the_readme_says() -> None:
    """jobs/demo.yaml as the README describes it: the built-in model, the prepared ShareGPT
    folder beside it, outputs to jobs/out/demo."""
    from batchgen.job.config_file import load_job_config

    config = load_job_config(DEMO)
    assert config.model is None
    assert config.resolve_path(config.io.input) == ROOT / "jobs" / "data" / "sharegpt"
    assert config.resolve_path(config.io.output) == ROOT / "jobs" / "out" / "demo"


def test_quickstart_script_runs(tmp_path: Path) -> None:
    """`python jobs/quickstart.py`, with its own knobs turned down (2 prompts, 4 tokens)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "quickstart.py"), "--num-prompts", "2", "--max-tokens", "4", "--threads", "1"],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n### ") == 2
    assert "2 prompts in " in proc.stdout and "output tokens/s" in proc.stdout
    finished = re.findall(r"^\[(stop|length), ([0-9]+) tokens\]$", proc.stdout, flags=re.MULTILINE)
    assert len(finished) == 2 and all(1 <= int(n) <= 4 for _, n in finished), proc.stdout

