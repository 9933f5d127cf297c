"""Llama models with RoPE scaling against transformers, in every invariance mode (issue 23).

One tiny random Llama (head_dim 16, GQA 2, theta 10000) is written once; each case is a copy of
it whose config.json carries another `rope_parameters`, so the cases differ only in their
scaling. Each runs through `tests/engine/parity.py` in its four modes (prefix cache on and off,
an 8-token chunk budget, forced preemption): every greedy token is transformers' argmax on the
same prefix (or a near tie there) and every token's log-probability is within 1e-4 of
transformers' `log_softmax`, in float32.

- llama3 (factor 8, low 1, high 4, original context 64): rotary wavelengths 6 to 19869 tokens
  against cut-offs of 16 and 64, so pairs are kept, smoothed and divided;
- linear (factor 4);
- yarn (factor 4, original context 32, Qwen's shape of block): the ramp over the fast pairs and
  the attention factor 0.1 ln 4 + 1 on cos and sin;
- dynamic NTK (factor 4, max_position_embeddings 128): the engine cannot hold more than
  max_position_embeddings tokens (it refuses a larger max_model_len), and up to that length both
  it and transformers rotate with the unscaled base (tests/models/test_rope_vs_transformers.py),
  so here the dynamic model must equal the unscaled one in transformers too (checked) and the
  engine must match it. Growth past max_position_embeddings is not something the engine does;
  transformers does it per forward pass and vLLM with one fixed table (see that file).

`test_scaling_moves_the_reference` keeps the parity cases honest: each scaled model's reference
log-probabilities differ from the unscaled model's by more than 0.01 on the prompts used, so a
scaling the engine ignored would fail the 1e-4 bound.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from batchgen.models.config import ModelConfig
from tests.engine.parity import check_parity, shared_prefix_prompts, transformers_model
from tests.tiny_models import TINY_VOCAB_SIZE, make_tiny_hf_folder

THETA = 10000.0
SCALINGS: dict[str, dict[str, Any]] = {
    "llama3": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    # DeepSeek-style mscales (attention factor below 1), narrower betas.
    "yarn-mscale": {
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16, "mscale": 0.707,
        "mscale_all_dim": 1.0, "beta_fast": 16.0, "beta_slow": 2.0,
    },
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
}  # fmt: skip
# The invariance modes hold up to 128 tokens; the dynamic model's limit is exactly that.
MAX_POSITIONS = {"dynamic": 128}


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama without scaling; the cases copy its weights."""
    return make_tiny_hf_folder(tmp_path_factory.mktemp("plain"), hidden_size=64, num_heads=4, num_kv_heads=2)


def _scaled_copy(plain: Path, target: Path, kind: str) -> Path:
    folder = Path(shutil.copytree(plain, target / f"tiny-llama-{kind}"))
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    config["rope_parameters"] = {**SCALINGS[kind], "rope_theta": THETA}
    config["max_position_embeddings"] = MAX_POSITIONS.get(kind, config["max_position_embeddings"])
    config_file.write_text(json.dumps(config))
    return folder


def _prompts() -> list[list[int]]:
    return shared_prefix_prompts(TINY_VOCAB_SIZE)


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_matches_transformers_in_every_invariance_mode(plain_folder: Path, tmp_path: Path, kind: str) -> None:
    folder = _scaled_copy(plain_folder, tmp_path, kind)
    scaling = ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text())).rope_scaling
    assert scaling is not None and scaling.rope_type == SCALINGS[kind]["rope_type"]
    report = check_parity(folder, _prompts())
    assert report.worst_logprob_error < 1e-4
    assert report.num_preemptions > 0


def _reference_logprobs(model: torch.nn.Module, prompts: list[list[int]]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [torch.log_softmax(model(torch.tensor([p])).logits[0].float(), dim=-1) for p in prompts]


def test_scaling_moves_the_reference(plain_folder: Path, tmp_path: Path) -> None:
    """transformers on the prompts of the parity cases (10 to 50 tokens): llama3, linear and yarn
    change the log-probabilities by more than 0.01; dynamic below max_position_embeddings changes
    nothing."""
    prompts = _prompts()
    plain = _reference_logprobs(transformers_model(plain_folder), prompts)
    for kind in SCALINGS:
        scaled = _reference_logprobs(transformers_model(_scaled_copy(plain_folder, tmp_path, kind)), prompts)
        moved = max(float((a - b).abs().max()) for a, b in zip(scaled, plain, strict=True))
        if kind == "dynamic":
            assert moved == 0.0, kind
        else:
            assert moved > 0.01, (kind, moved)


# Phi-3's LongRoPE on a tiny Phi-3: 8 rotary pairs, original context 32 of 128. The engine's
# max_model_len (64 or 128) exceeds 32, so it rotates with the long factors; prompts of 33 tokens
# or more make transformers take them too (it switches per forward pass on the sequence length).
LONGROPE = {
    "rope_type": "longrope", "short_factor": [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5],
    "long_factor": [1.0, 1.3, 1.9, 2.8, 4.0, 5.5, 7.0, 8.0],
}  # fmt: skip


def test_phi3_longrope_matches_transformers_in_every_invariance_mode(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(
        tmp_path, architecture="phi3", hidden_size=64, num_heads=4, num_kv_heads=2, rope_scaling=LONGROPE,
        extra_config={"original_max_position_embeddings": 32, "max_position_embeddings": 128},
    )  # fmt: skip
    config = ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text()))
    assert config.rope_scaling is not None and config.rope_scaling.rope_type == "longrope"
    assert (config.rope_scaling.original_max_position_embeddings, config.rope_scaling.factor) == (32, 4.0)
    prompts = shared_prefix_prompts(TINY_VOCAB_SIZE, min_len=33)
    assert len(prompts) >= 3 and min(map(len, prompts)) > 32
    report = check_parity(folder, prompts)
    assert report.worst_logprob_error < 1e-4
    assert report.num_preemptions > 0
    # The long factors matter: with the short ones in their place the reference moves by > 0.01.
    short = Path(shutil.copytree(folder, tmp_path / "short"))
    short_config = json.loads((short / "config.json").read_text())
    short_config["rope_parameters"]["long_factor"] = LONGROPE["short_factor"]
    (short / "config.json").write_text(json.dumps(short_config))
    pairs = zip(*(_reference_logprobs(transformers_model(f), prompts) for f in (folder, short)), strict=True)
    assert max(float((a - b).abs().max()) for a, b in pairs) > 0.01
