"""The whole engine with every Triton kernel forced (interpreted on CPU) matches the PyTorch path.

tests/conftest.py sets TRITON_INTERPRET=1 before anything imports the kernels.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batchgen import LLM, SamplingParams
from tests.tiny_models import make_tiny_hf_folder

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU run of Triton needs TRITON_INTERPRET=1"
)


def test_triton_backend_gives_the_same_greedy_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from batchgen.kernels import triton_attention

    calls: list[int] = []
    real = triton_attention.paged_attention_triton

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(triton_attention, "paged_attention_triton", spy)
    folder = make_tiny_hf_folder(tmp_path, num_layers=2, num_heads=4, num_kv_heads=2, hidden_size=128, head_dim=32)
    # A shared prefix (cache hit mid-prompt), a chunked prompt, and decodes in the same batch.
    prompts = [
        [1500 + i for i in range(20)],
        [1500 + i for i in range(18)] + [30000, 30001, 30002],
        [2500, 2600, 2700],
    ]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outputs = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(folder), attention_backend=backend, block_size=16, max_num_batched_tokens=24, seed=0)
        outs = llm.generate(prompts, params, use_tqdm=False)
        outputs[backend] = [list(o.outputs[0].token_ids) for o in outs]
        assert llm.stats()["cached_prompt_tokens"] >= 16
    assert outputs["triton"] == outputs["torch"]
    assert len(calls) >= 2 * 4  # two layers, at least four steps: the kernel really ran
