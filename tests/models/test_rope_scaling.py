"""RoPE scaling end to end: the engine's greedy tokens and log-probabilities equal transformers' on
the same weights, for llama3 and linear scaling, from a Hugging Face folder and from a GGUF
written the way llama.cpp's converter writes it (issue 20).

batchgen supports rope types default, linear, llama3, dynamic, yarn and longrope
(`batchgen.models.config`; each is checked against transformers' own function in
test_rope_vs_transformers.py); any other is refused at load, naming the file and the key. The
tiny models' rotary frequencies span both sides of the llama3 cut-offs (head_dim 16, theta
10000, original context 256: wavelengths 6 to 19869 tokens against cut-offs of 64 and 256), so
every branch of the formula is used, and prompts are long enough (up to 70 tokens) that the
scaled frequencies move the logits: the same weights without scaling give other
log-probabilities (checked).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from batchgen import LLM, SamplingParams
from batchgen.models.checkpoint import load_checkpoint
from batchgen.models.config import RopeScaling
from tests.tiny_models import llama3_rope_freqs, make_tiny_gguf, make_tiny_hf_folder

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
LINEAR = {"rope_type": "linear", "factor": 4.0}
SCALINGS = {"llama3": LLAMA3, "linear": LINEAR}
NEW_TOKENS = 12
TOP_LOGPROBS = 8
# float32 engine against float32 transformers: log-probabilities agree to 4e-5 to 5e-5; a wrong
# frequency (or none scaled) moves them by more than 0.01 (test_scaling_changes_the_logits).
LOGPROB_ATOL = 2e-4
NEAR_TIE = 1e-3


def _prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(vocab_size) for _ in range(n)] for n in (5, 33, 70)]


def _engine_steps(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], list[dict[int, float]]]]:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=TOP_LOGPROBS)
    steps = []
    for out in llm.generate(prompts, params, use_tqdm=False):
        sample = out.outputs[0]
        assert sample.logprobs is not None and len(sample.token_ids) == NEW_TOKENS
        steps.append((list(sample.token_ids), [dict(entry) for entry in sample.logprobs]))
    return steps


def _reference_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' log-probabilities [NEW_TOKENS, vocab] before each of `tokens`, in one
    forward pass over the prompt and the engine's tokens (teacher forcing)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)], dim=-1)


def assert_matches_transformers(llm: LLM, reference: torch.nn.Module) -> float:
    """The engine's greedy tokens are transformers' argmax at every step (or a near tie there) and
    its top log-probabilities equal transformers'; returns the largest log-probability error."""
    prompts = _prompts(llm.engine.model_config.vocab_size)
    worst = 0.0
    for prompt, (tokens, logprobs) in zip(prompts, _engine_steps(llm, prompts), strict=True):
        ref = _reference_logprobs(reference, prompt, tokens)
        for step, (token, entry) in enumerate(zip(tokens, logprobs, strict=True)):
            top2 = torch.topk(ref[step], 2)
            if token != int(top2.indices[0]):
                gap = float(top2.values[0] - top2.values[1])
                assert gap < NEAR_TIE, f"prompt of {len(prompt)}, step {step}: {token} vs {int(top2.indices[0])}"
            ids = torch.tensor(sorted(entry))
            ours = torch.tensor([entry[i] for i in sorted(entry)])
            worst = max(worst, float((ours - ref[step][ids]).abs().max()))
    assert worst < LOGPROB_ATOL, f"largest log-probability error {worst:.2e}"
    return worst


def _transformers(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


def _tiny(tmp_path: Path, rope_scaling: Mapping[str, Any] | None) -> Path:
    return make_tiny_hf_folder(tmp_path, hidden_size=64, num_heads=4, num_kv_heads=2, rope_scaling=rope_scaling)


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_hf_folder_matches_transformers(tmp_path: Path, kind: str) -> None:
    folder = _tiny(tmp_path, SCALINGS[kind])
    llm = LLM(str(folder), seed=0, max_num_batched_tokens=64)
    assert llm.engine.model_config.rope_scaling is not None
    assert llm.engine.model_config.rope_scaling.rope_type == kind
    assert_matches_transformers(llm, _transformers(folder))


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_gguf_matches_transformers(tmp_path: Path, kind: str) -> None:
    """The GGUF carries llama3 scaling only as `rope_freqs` (written from the formula in
    tests/tiny_models.py, not by the loader), linear as metadata; the reference is transformers
    on the Hugging Face folder holding the same weights."""
    tiny = make_tiny_gguf(tmp_path, num_heads=4, num_kv_heads=2, rope_scaling=SCALINGS[kind])
    llm = LLM(str(tiny.gguf_path), seed=0, max_num_batched_tokens=64)
    expected = load_checkpoint(tiny.hf_folder).config.rope_scaling
    assert llm.engine.model_config.rope_scaling == expected
    assert_matches_transformers(llm, _transformers(tiny.hf_folder))


def test_scaling_changes_the_logits(tmp_path: Path) -> None:
    """The cases above are sensitive to the scaling: the engine without it is off by > 0.01."""
    scaled = _tiny(tmp_path / "scaled", LLAMA3)
    plain = _tiny(tmp_path / "plain", None)  # the same seed: the same weights
    with pytest.raises(AssertionError, match="log-probability error|step"):
        assert_matches_transformers(LLM(str(plain), seed=0), _transformers(scaled))
    prompts = _prompts(49152)[2:]
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=TOP_LOGPROBS)
    (a,), (b,) = (LLM(str(f), seed=0).generate(prompts, params, use_tqdm=False) for f in (scaled, plain))
    assert a.outputs[0].logprobs is not None and b.outputs[0].logprobs is not None
    shared = set(a.outputs[0].logprobs[0]) & set(b.outputs[0].logprobs[0])
    assert shared and max(abs(a.outputs[0].logprobs[0][t] - b.outputs[0].logprobs[0][t]) for t in shared) > 0.01


def test_rope_freqs_helper_follows_the_llama3_formula() -> None:
    """The independent `rope_freqs` of the tiny GGUF: 1 where wavelengths are below 256 / 4,
    `factor` above 256 / 1, and the smooth interpolation between (here exactly one frequency)."""
    freqs = llama3_rope_freqs(LLAMA3, 16, 10000.0)
    wavelen = 2 * np.pi * 10000.0 ** (np.arange(0, 16, 2) / 16)
    assert np.all(freqs[wavelen < 64] == 1.0) and np.all(freqs[wavelen > 256] == 8.0)
    (medium,) = np.flatnonzero((wavelen >= 64) & (wavelen <= 256))
    smooth = (256 / wavelen[medium] - 1.0) / 3.0
    assert freqs[medium] == pytest.approx(1 / ((1 - smooth) / 8 + smooth), rel=1e-6)
    assert 1.0 < freqs[medium] < 8.0


def test_gguf_with_other_llama3_factors_is_refused(tmp_path: Path) -> None:
    """GGUF keeps only the per-frequency divisors; the loader assumes Llama 3.1's low/high
    frequency factors (1, 4) and refuses a file whose `rope_freqs` says otherwise, rather than
    running it with the wrong frequencies."""
    other = {**LLAMA3, "low_freq_factor": 2.0}
    tiny = make_tiny_gguf(tmp_path, rope_scaling=other)
    with pytest.raises(ValueError, match=r"tiny-llama-0\.gguf: rope_freqs\.weight does not match llama3"):
        load_checkpoint(tiny.gguf_path)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "proportional", "factor": 4.0},
        {"rope_type": "mrope", "factor": 2.0},
    ],
    ids=lambda p: p["rope_type"],
)
def test_unsupported_rope_type_in_a_folder_is_an_error(tmp_path: Path, rope_parameters: dict[str, Any]) -> None:
    folder = _tiny(tmp_path, None)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    config["rope_parameters"] = {**rope_parameters, "rope_theta": 10000.0}
    config_file.write_text(json.dumps(config))
    rope_type = rope_parameters["rope_type"]
    with pytest.raises(ValueError, match=rf"config\.json: rope_parameters type '{rope_type}' is not supported"):
        LLM(str(folder), seed=0)


def test_unsupported_rope_type_in_a_gguf_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf

    def yarn(self: gguf.GGUFWriter, value: gguf.RopeScalingType) -> None:
        self.add_string(gguf.Keys.Rope.SCALING_TYPE.format(arch=self.arch), "yarn")

    monkeypatch.setattr(gguf.GGUFWriter, "add_rope_scaling_type", yarn)
    tiny = make_tiny_gguf(tmp_path, rope_scaling=LINEAR)  # written as yarn
    with pytest.raises(ValueError, match=r"tiny-llama-0\.gguf: llama\.rope\.scaling\.type 'yarn' is not supported"):
        LLM(str(tiny.gguf_path), seed=0)


def test_rope_scaling_config_values() -> None:
    """What the folders above load as (the dataclass the model is built from)."""
    from batchgen.models.config import ModelConfig

    base = {
        "model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2,
    }  # fmt: skip
    assert ModelConfig.from_hf_dict({**base, "rope_scaling": LLAMA3}).rope_scaling == RopeScaling(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=256
    )
    assert ModelConfig.from_hf_dict({**base, "rope_scaling": LINEAR}).rope_scaling == RopeScaling("linear", factor=4.0)
