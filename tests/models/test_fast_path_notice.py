"""No silent fallback to the PyTorch path (issue 23): a supported model on the CPU in float32 runs
the fast path, and a model that cannot says so once, at load.

The fast path on the CPU is the linear layers with weights packed once (`kernels.linear_cpu`) and
the compiled kernel for attention, the KV write, RMSNorm, the rotary embedding and SiLU-and-mul
(`kernels.attention_cpu`). What each step really calls is counted by wrapping those functions
where the model and the dispatcher look them up, so a model that built the right objects but
still reached the PyTorch path would fail. Not counted as fallbacks, because no compiled variant
exists: Gemma's gelu-tanh gate (PyTorch, `mlp._gelu_tanh_and_mul`) and a mixture of experts'
router (`F.linear` over a few rows, in `MoEMLP.route`).

`DecoderModel` logs each reason it cannot take the fast path (`fast_path_notes`) as one warning
on the "batchgen.models" logger when it is built; nothing is logged per step. Checked here for a
bfloat16 model, a torch build without a weight packer, and a machine where the compiled kernel
cannot be built; asking for `attention_backend="torch"` (the reference path) is no fallback and
logs nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import batchgen.kernels.dispatch as dispatch
import batchgen.models.attention
import batchgen.models.decoder
import batchgen.models.mlp
from batchgen import LLM, SamplingParams
from batchgen.kernels import PackedLinear, packed_linear_library, resolve_backend
from batchgen.kernels.attention_cpu import is_cpu_kernel_available, is_cpu_kv_layout
from batchgen.models.decoder import DecoderModel
from batchgen.models.mlp import DenseMLP, MoEMLP
from tests.tiny_models import ARCHITECTURES, make_tiny_hf_folder

pytestmark = pytest.mark.skipif(
    packed_linear_library() is None or not is_cpu_kernel_available(),
    reason="no weight packer or no C++ compiler for the CPU kernel here",
)

# Small expert counts: the defaults of transformers' MoE configs are 128 experts.
EXTRA: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}
ENGINE = {"max_model_len": 64, "num_kv_blocks": 16, "max_num_batched_tokens": 32}
PARAMS = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
PROMPTS = [[1000 + i for i in range(12)], [2000 + i for i in range(5)]]

# (module, name, counter key) of each fast-path and PyTorch-path function watched.
_WATCHED = [
    (dispatch, "paged_attention_cpu", "attention_cpu"),
    (dispatch, "paged_attention_torch", "attention_torch"),
    (dispatch, "write_kv_cpu", "write_kv_cpu"),
    (dispatch, "write_kv_torch", "write_kv_torch"),
    (dispatch, "rms_norm_cpu", "rms_norm_cpu"),
    (dispatch, "rotary_embedding_cpu", "rotary_cpu"),
    (dispatch, "silu_and_mul_cpu", "silu_cpu"),
    (batchgen.models.mlp, "silu_gate_up", "silu_fused"),
]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of the watched calls from here on; linear calls as "linear_packed" / "linear_plain"."""
    counts: Counter[str] = Counter()

    def counted(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return fn(*args, **kwargs)

        return wrapper

    for module, name, key in _WATCHED:
        monkeypatch.setattr(module, name, counted(key, getattr(module, name)))
    for module in (batchgen.models.attention, batchgen.models.mlp, batchgen.models.decoder):
        linear = module.linear

        def classified(x: torch.Tensor, weight: Any, bias: Any = None, _linear: Any = linear) -> Any:
            counts["linear_packed" if isinstance(weight, PackedLinear) else "linear_plain"] += 1
            return _linear(x, weight, bias)

        monkeypatch.setattr(module, "linear", classified)
    return counts


def _notices(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("batchgen")]


def _model(llm: LLM) -> DecoderModel:
    model = llm.engine.runner.model
    assert isinstance(model, DecoderModel)
    return model


def _generate_several(llm: LLM) -> None:
    for _ in range(3):
        outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]


def _assert_packed(model: DecoderModel) -> None:
    assert model.packed_linear and isinstance(model.lm_head, PackedLinear)
    for layer in model.layers:
        assert isinstance(layer.attention.qkv, PackedLinear) and isinstance(layer.attention.o_proj, PackedLinear)
        mlp = layer.mlp
        if isinstance(mlp, DenseMLP):
            weights = [mlp.gate_up, mlp.down]
        else:
            assert isinstance(mlp, MoEMLP)
            weights = [*mlp.gate_ups, *mlp.downs]
        assert all(isinstance(w, PackedLinear) for w in weights)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_every_family_takes_the_fast_path_in_float32_without_a_notice(
    tmp_path: Path, architecture: str, calls: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    folder = make_tiny_hf_folder(tmp_path, architecture=architecture, extra_config=EXTRA.get(architecture))
    with caplog.at_level(logging.DEBUG, logger="batchgen"):
        llm = LLM(str(folder), seed=0, device="cpu", **ENGINE)
        model = _model(llm)
        assert model.dtype == torch.float32 and model.fast_path_notes == ()
        assert model.attention_backend is None and resolve_backend(None, model.device) == "cpu"
        _assert_packed(model)
        assert all(is_cpu_kv_layout(k, v) for k, v in llm.engine.runner.kv_caches)
        _generate_several(llm)
    assert _notices(caplog) == []
    assert calls["attention_torch"] == calls["write_kv_torch"] == calls["linear_plain"] == 0, dict(calls)
    num_layers = model.config.num_layers
    assert calls["attention_cpu"] == calls["write_kv_cpu"] > 0 and calls["attention_cpu"] % num_layers == 0
    assert calls["linear_packed"] > 0 and calls["rms_norm_cpu"] > 0 and calls["rotary_cpu"] > 0
    if model.config.hidden_act == "silu":
        # batchgen's own linear kernel fuses a dense MLP's silu into its gate/up product
        dense = isinstance(model.layers[0].mlp, DenseMLP)
        fused = dense and packed_linear_library() == "batchgen"
        assert (calls["silu_fused"] > 0) == fused and (calls["silu_cpu"] > 0) == (not dense or not fused), dict(calls)


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"))


def _load_and_generate(folder: Path, caplog: pytest.LogCaptureFixture, **options: Any) -> tuple[DecoderModel, list[str]]:
    """The model and its notices: once after the load, and the same after three generate calls."""
    with caplog.at_level(logging.DEBUG, logger="batchgen"):
        llm = LLM(str(folder), seed=0, device="cpu", **ENGINE, **options)
        at_load = _notices(caplog)
        _generate_several(llm)
    assert _notices(caplog) == at_load, "a notice after the load"
    return _model(llm), at_load


def test_bfloat16_says_so_once_at_load(llama_folder: Path, calls: Counter[str], caplog: pytest.LogCaptureFixture) -> None:
    model, notices = _load_and_generate(llama_folder, caplog, dtype="bfloat16")
    assert len(notices) == 1 and notices == [f"llama model: {n}" for n in model.fast_path_notes]
    assert "unpacked" in notices[0] and "torch.bfloat16" in notices[0] and "float32" in notices[0]
    # What the notice says is what runs.
    assert not model.packed_linear and calls["linear_packed"] == 0 and calls["linear_plain"] > 0
    assert calls["attention_cpu"] == 0 and calls["attention_torch"] > 0 and calls["rms_norm_cpu"] == 0


def test_no_weight_packer_says_so_once_at_load(
    llama_folder: Path, monkeypatch: pytest.MonkeyPatch, calls: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(batchgen.models.decoder, "packed_linear_library", lambda: None)
    _, notices = _load_and_generate(llama_folder, caplog)
    assert len(notices) == 1 and "neither MKL nor oneDNN" in notices[0] and "float32" not in notices[0]
    assert calls["linear_packed"] == 0 and calls["linear_plain"] > 0
    assert calls["attention_cpu"] > 0 and calls["attention_torch"] == 0  # attention stays compiled


def test_no_cpu_kernel_says_so_once_at_load(
    llama_folder: Path, monkeypatch: pytest.MonkeyPatch, calls: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(dispatch, "is_cpu_kernel_available", lambda: False)
    model, notices = _load_and_generate(llama_folder, caplog)
    assert notices == ["llama model: attention runs on the PyTorch path: the compiled CPU kernel cannot be built here"]
    assert calls["attention_cpu"] == 0 and calls["attention_torch"] > 0
    assert model.packed_linear and calls["linear_plain"] == 0  # the linear layers stay packed


def test_the_reference_backend_asked_for_is_no_fallback(
    llama_folder: Path, calls: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    model, notices = _load_and_generate(llama_folder, caplog, attention_backend="torch")
    assert notices == [] and model.fast_path_notes == ()
    assert calls["attention_cpu"] == 0 and calls["attention_torch"] > 0 and calls["linear_packed"] == 0
