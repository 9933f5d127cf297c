"""Bounded memory on a large job, and prefix ordering against the ideal prefill."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.cli.main import main
from batchgen.radix import trie_token_count
from batchgen.tokenizer.tokenizer import Tokenizer
from tests.tiny_models import make_tiny_hf_folder

# Subprocess-heavy / scale: `python -m pytest -m "not slow"` leaves them out while iterating.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _peak_rss_kib(job: Path) -> int:
    """Run the job in a fresh interpreter and return its peak resident set (VmHWM)."""
    code = (
        "import sys\n"
        "from batchgen.cli.main import main\n"
        "rc = main(['run', sys.argv[1], '--quiet', '--threads', '1'])\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print('PEAK_KIB', hwm)\n"
        "sys.exit(rc)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(job)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PEAK_KIB"))
    return int(line.split()[1])


def test_peak_memory_is_flat_from_10k_to_100k_rows(tmp_path: Path, model: Path) -> None:
    peaks = {}
    for num_rows in (10_000, 100_000):
        data = tmp_path / f"data{num_rows}"
        data.mkdir()
        ids = pa.array(range(num_rows), pa.int64())
        prompts = pa.array([f"row {i % 97} says {i}" for i in range(num_rows)], pa.string())
        pq.write_table(pa.table({"id": ids, "prompt": prompts}), data / "part-0.parquet", row_group_size=8192)
        job = tmp_path / f"job{num_rows}.yaml"
        job.write_text(
            f"model: {model}\ninput: {{path: {data}}}\noutput: {{path: {tmp_path / f'out{num_rows}'}}}\n"
            "sampling: {max_tokens: 1, temperature: 0}\n"
        )
        peaks[num_rows] = _peak_rss_kib(job)
        out = pq.ParquetFile(tmp_path / f"out{num_rows}" / "part-0.parquet")
        assert out.metadata.num_rows == num_rows
    growth = peaks[100_000] / peaks[10_000] - 1
    print(f"peak RSS {peaks}")
    assert growth < 0.10, f"peak RSS {peaks[10_000]} KiB -> {peaks[100_000]} KiB (+{growth:.1%})"


def _single_token_words(tok: Tokenizer, count: int, rng: random.Random) -> list[str]:
    """Words that encode to exactly one token with a leading space, so prompts built from
    them have a known token count (block-aligned prefixes)."""
    words = []
    for token_id in rng.sample(range(1000, 40000), 6000):
        text = tok.decode([token_id])
        if len(text) > 3 and text.startswith(" ") and text[1:].isalpha() and tok.encode(text) == [token_id]:
            words.append(text)
            if len(words) == count:
                return words
    raise AssertionError("not enough single-token words")


def test_prefix_order_computes_close_to_the_ideal(tmp_path: Path, model: Path) -> None:
    tok = Tokenizer.from_hf_folder(model)
    rng = random.Random(4)
    words = _single_token_words(tok, 1200, rng)
    prompts = []
    for g in range(16):
        prefix = "".join(words[g * 64 : (g + 1) * 64])  # 64 tokens: four full blocks
        for k in range(8):
            suffix = "".join(rng.sample(words[1024:], 6))
            prompts.append(prefix + suffix + f" {g}{k}")
    rng.shuffle(prompts)
    token_lists = tok.encode_batch(prompts)
    ideal = trie_token_count(token_lists)
    (tmp_path / "data").mkdir()
    pq.write_table(
        pa.table({"id": pa.array(range(len(prompts)), pa.int64()), "prompt": pa.array(prompts, pa.string())}),
        tmp_path / "data" / "part-0.parquet",
    )
    computed = {}
    for order in ("prefix", "input"):
        job = tmp_path / f"job-{order}.yaml"
        job.write_text(
            f"model: {model}\ninput: {{path: data}}\noutput: {{path: out-{order}}}\n"
            "sampling: {max_tokens: 2, temperature: 0}\n"
            f"order: {order}\nwindow_rows: 256\n"
            "engine: {max_num_seqs: 4, num_kv_blocks: 24, max_model_len: 128, max_num_batched_tokens: 512}\n"
        )
        assert main(["run", str(job), "--quiet"]) == 0
        summary = json.loads((tmp_path / f"out-{order}" / "summary.json").read_text())
        assert summary["rows"]["by_status"] == {"ok": len(prompts)}
        computed[order] = summary["tokens"]["prefill_computed"]
        assert summary["prefix_hit_rate"]["ideal"] == pytest.approx(1 - ideal / sum(map(len, token_lists)))
    print(f"ideal prefill {ideal}, computed {computed}")
    assert computed["prefix"] <= 1.1 * ideal, computed
    assert computed["input"] >= 2 * computed["prefix"], computed
