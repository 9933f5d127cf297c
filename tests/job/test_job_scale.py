"""Bounded memory on a large job, and prefix ordering against the ideal prefill."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

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


class Peaks(NamedTuple):
    rss_kib: int  # the process's peak resident set (VmHWM)
    arrow_bytes: int  # the peak of Arrow's default memory pool (what Parquet reads allocate)


def _peaks(job: Path) -> Peaks:
    """Run the job in a fresh interpreter and return its memory peaks."""
    code = (
        "import sys\n"
        "import pyarrow as pa\n"
        "from batchgen.cli.main import main\n"
        "rc = main(['run', sys.argv[1], '--quiet', '--threads', '1'])\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print('PEAKS', hwm, pa.default_memory_pool().max_memory())\n"
        "sys.exit(rc)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(job)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PEAKS"))
    return Peaks(int(line.split()[1]), int(line.split()[2]))


# Each row carries a 2,000-character passthrough column: a 100k-row shard holds 200 MB of it in
# memory (80 MB at 40k rows), so a reader that loads a whole shard shows. The smaller job must be
# large enough to fill the pipeline's bounded buffers (record batches of 8,192 rows, a few per
# stream): otherwise the comparison measures them filling. On the 2-core AVX2 EPYC 10k rows did
# (10k -> 100k rows: the streaming reader 830 -> 888 MB and 818 -> 896 MB of peak RSS, +7% and
# +9.4%; the rows' passthrough strings pass through Python and glibc's heap, which a CPU model
# keeps at its peak; 18 -> 29 MB of Arrow pool; a reader patched to pq.read_table each shard 850
# -> 1090 MB, +28%, and 27 -> 227 MB of Arrow pool). On a faster AVX-512 EPYC the engine keeps up
# longer and 10k rows did not (10k / 20k / 40k / 100k / 200k rows: 518 / 543 / 588 / 616 / 645 MB,
# 15 / 24 / 27 / 27 / 27 MB of Arrow pool; 10k -> 100k failed the bound at +18% and +22%), so the
# test compares 40k with 100k: there 580-588 -> 616 MB (+5%), and the whole-shard reader 707 ->
# 834 MB (+18%) and 134 -> 265 MB of Arrow pool. The bounds lie between.
_MAX_RSS_GROWTH = 0.15
_MAX_ARROW_GROWTH_BYTES = 64 << 20
_BLOB_CHARS = 2000
_ROW_GROUP_ROWS = 8192


def _write_shard(path: Path, num_rows: int) -> None:
    """id, a short prompt and a long `blob` passthrough column, written a row group at a time."""
    rng = random.Random(num_rows)
    alphabet = "abcdefghijklmnopqrstuvwxyz ,.0123456789"
    base = "".join(rng.choice(alphabet) for _ in range(2 * _BLOB_CHARS))
    schema = pa.schema([("id", pa.int64()), ("prompt", pa.string()), ("blob", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, num_rows, _ROW_GROUP_ROWS):
            ids = range(start, min(num_rows, start + _ROW_GROUP_ROWS))
            blobs = [f"{i:09d}" + base[i % _BLOB_CHARS : i % _BLOB_CHARS + _BLOB_CHARS - 9] for i in ids]
            writer.write_table(pa.table({
                "id": pa.array(ids, pa.int64()),
                "prompt": pa.array([f"row {i % 97} says {i}" for i in ids], pa.string()),
                "blob": pa.array(blobs, pa.string()),
            }, schema=schema))  # fmt: skip


def test_peak_memory_is_flat_from_40k_to_100k_rows(tmp_path: Path, model: Path) -> None:
    peaks = {}
    for num_rows in (40_000, 100_000):
        data = tmp_path / f"data{num_rows}"
        data.mkdir()
        _write_shard(data / "part-0.parquet", num_rows)
        assert pq.read_metadata(data / "part-0.parquet").num_rows == num_rows
        job = tmp_path / f"job{num_rows}.yaml"
        job.write_text(
            f"model: {model}\ninput: {{path: {data}, columns: {{passthrough: [blob]}}}}\n"
            f"output: {{path: {tmp_path / f'out{num_rows}'}}}\n"
            "sampling: {max_tokens: 1, temperature: 0}\nreport: false\n"
        )
        peaks[num_rows] = _peaks(job)
        out = pq.ParquetFile(tmp_path / f"out{num_rows}" / "part-0.parquet")
        assert out.metadata.num_rows == num_rows
        last = out.read_row_group(out.num_row_groups - 1, columns=["id", "blob"]).to_pylist()[-1]
        assert last["id"] == num_rows - 1 and len(last["blob"]) == _BLOB_CHARS  # the column went through
    small, large = peaks[40_000], peaks[100_000]
    print(f"peaks {peaks}")
    growth = large.rss_kib / small.rss_kib - 1
    assert growth < _MAX_RSS_GROWTH, f"peak RSS {small.rss_kib} KiB -> {large.rss_kib} KiB (+{growth:.1%})"
    arrow_growth = large.arrow_bytes - small.arrow_bytes
    assert arrow_growth < _MAX_ARROW_GROWTH_BYTES, f"Arrow pool peak {small.arrow_bytes} -> {large.arrow_bytes} bytes"


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
