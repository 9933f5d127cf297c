"""`batchgen bench` on a tiny model: the modes run the same requests and report consistent figures."""

from __future__ import annotations

import json
from pathlib import Path

from batchgen.cli.bench import run_bench
from tests.report.helpers import assert_self_contained, images
from tests.tiny_models import make_tiny_hf_folder


def test_bench_modes_agree_on_the_work_done(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(tmp_path, num_heads=4, num_kv_heads=2, hidden_size=64)
    out = tmp_path / "bench.json"
    results = run_bench(
        model=str(folder),
        num_prompts=6,
        max_tokens=5,
        modes=["continuous", "static", "transformers"],
        max_num_seqs=4,
        max_num_batched_tokens=256,
        dtype=None,
        device="cpu",
        out=out,
        output_lens="sharegpt",
        use_tqdm=False,
    )
    by_mode = {r.mode: r for r in results}
    # greedy decoding: both batching modes generate exactly the same tokens (compared token by
    # token through the digest of every request's output ids, not only their number)
    assert by_mode["continuous"].output_digest == by_mode["static"].output_digest
    assert by_mode["continuous"].output_tokens == by_mode["static"].output_tokens > 0
    assert all(len(r.output_digest) == 64 for r in results)
    assert by_mode["continuous"].prompt_tokens == by_mode["transformers"].prompt_tokens
    assert 0 < by_mode["transformers"].output_tokens <= 6 * 5
    assert by_mode["static"].num_steps >= by_mode["continuous"].num_steps
    payload = json.loads(out.read_text())
    assert [r["mode"] for r in payload["results"]] == ["continuous", "static", "transformers"]
    assert payload["output_lens"] == "sharegpt"
    assert [r["output_digest"] for r in payload["results"]] == [r.output_digest for r in results]
    # The report page: the three modes side by side, the two engine modes' timelines overlaid.
    page = (tmp_path / "bench.html").read_text()
    assert_self_contained(page)
    assert len(images(page)) == 4
    modes = page[page.index("<h2>Modes</h2>"):page.index("<h2>Timeline")]
    assert all(f"<td>{m}</td>" in modes for m in ("continuous", "static", "transformers"))
    assert "torch_threads" in page
