"""`linear_dtype: bfloat16` (issue 25): a float32 CPU model whose linear layers take bfloat16
operands through oneDNN, everything else float32. Checked: every projection and the LM head are
packed that way and called that way, the outputs stay close to float32's without being float32's,
the KV cache and attention stay float32 and compiled, and every combination it cannot serve is a
clear error at load."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import batchgen.kernels.linear_cpu as linear_cpu
import batchgen.models.decoder
from batchgen import LLM, SamplingParams
from batchgen.engine.config import RunnerConfig
from batchgen.kernels import PackedLinear, bf16_linear_supported, packed_linear_library
from batchgen.kernels.attention_cpu import is_cpu_kernel_available, is_cpu_kv_layout
from batchgen.models.decoder import DecoderModel
from batchgen.models.mlp import DenseMLP, MoEMLP
from tests.tiny_models import make_tiny_hf_folder

pytestmark = pytest.mark.skipif(
    packed_linear_library() is None or not is_cpu_kernel_available() or not bf16_linear_supported(),
    reason="no weight packer, no C++ compiler or no bfloat16 linear layers here",
)

ENGINE = {"max_model_len": 64, "num_kv_blocks": 16, "max_num_batched_tokens": 32, "device": "cpu"}
PROMPTS = [[1000 + i for i in range(12)], [2000 + i for i in range(5)], [300 + 7 * i for i in range(20)]]
EXTRA = {"qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}}


def _weights(model: DecoderModel) -> list[Any]:
    out: list[Any] = [model.lm_head]
    for layer in model.layers:
        out += [layer.attention.qkv, layer.attention.o_proj]
        mlp = layer.mlp
        out += [mlp.gate_up, mlp.down] if isinstance(mlp, DenseMLP) else [*mlp.gate_ups, *mlp.downs]
        assert isinstance(mlp, DenseMLP | MoEMLP)
    return out


def _logprobs(llm: LLM, tokens: list[list[int]] | None = None) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy tokens and their logprobs; with `tokens`, the logprobs of those tokens as a
    continuation of each prompt (teacher forcing through prompt_logprobs)."""
    if tokens is None:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0), use_tqdm=False)
        ids = [list(o.outputs[0].token_ids) for o in outs]
        lps = [[lp[t] for lp, t in zip(o.outputs[0].logprobs or (), ids[i], strict=True)] for i, o in enumerate(outs)]
        return ids, lps
    seqs = [p + t for p, t in zip(PROMPTS, tokens, strict=True)]
    outs = llm.generate(seqs, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    lps = []
    for o, p, t in zip(outs, PROMPTS, tokens, strict=True):
        entries = o.prompt_logprobs or []
        lps.append([entries[len(p) + k][tok] for k, tok in enumerate(t)])  # type: ignore[index]
    return tokens, lps


@pytest.mark.parametrize("library", ["batchgen", "onednn"])
@pytest.mark.parametrize("architecture", ["llama", "qwen3_moe"])
def test_bf16_linear_layers_pack_and_run_every_projection_and_stay_close(
    tmp_path: Path, architecture: str, library: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each bfloat16 kernel this machine has (`bf16_linear_library` picks one: oneDNN with AMX,
    # else batchgen's where built), forced in turn.
    if not (linear_cpu.batchgen_bf16_linear() if library == "batchgen" else linear_cpu.onednn_bf16_supported()):
        pytest.skip(f"no {library} bfloat16 linear layers here")
    folder = make_tiny_hf_folder(tmp_path, architecture=architecture, extra_config=EXTRA.get(architecture))
    reference = LLM(str(folder), seed=0, **ENGINE)
    ref_ids, ref_lps = _logprobs(reference)

    calls: Counter[str] = Counter()
    real = linear_cpu.linear

    def counted(x: torch.Tensor, weight: Any, bias: Any = None) -> torch.Tensor:
        calls[str(weight.compute_dtype) if isinstance(weight, PackedLinear) else "plain"] += 1
        return real(x, weight, bias)

    for module in (batchgen.models.attention, batchgen.models.mlp, batchgen.models.decoder):
        monkeypatch.setattr(module, "linear", counted)
    for module in (linear_cpu, batchgen.models.mlp):
        monkeypatch.setattr(module, "bf16_linear_library", lambda: library)
    llm = LLM(str(folder), seed=0, linear_dtype="bfloat16", **ENGINE)
    model = llm.engine.runner.model
    assert isinstance(model, DecoderModel)
    assert model.dtype == torch.float32 and model.linear_dtype == torch.bfloat16 and model.fast_path_notes == ()
    weights = _weights(model)
    assert all(isinstance(w, PackedLinear) and w.compute_dtype == torch.bfloat16 for w in weights)
    # the chosen kernel runs them, and with batchgen's a dense MLP's gate/up is fused
    kernel = library == "batchgen"
    assert all(w.library == library for w in weights)
    mlp = model.layers[0].mlp
    assert not isinstance(mlp, DenseMLP) or (isinstance(mlp.gate_up, PackedLinear) and mlp.gate_up.gated == kernel)
    assert all(k.dtype == torch.float32 and is_cpu_kv_layout(k, v) for k, v in llm.engine.runner.kv_caches)

    # Along the float32 model's greedy tokens, the bfloat16 layers' logprobs are close but not equal.
    _, lps = _logprobs(llm, ref_ids)
    assert calls["torch.bfloat16"] > 0 and calls["torch.float32"] == 0 and calls["plain"] == 0, dict(calls)
    diffs = [abs(a - b) for ra, rb in zip(ref_lps, lps, strict=True) for a, b in zip(ra, rb, strict=True)]
    assert all(math.isfinite(d) for d in diffs)
    # (a tiny random model: one near-tie in a MoE router moves a position by a few tenths; 18 positions)
    assert sum(diffs) / len(diffs) < 0.1 and max(diffs) < 0.5 and max(diffs) > 1e-6, diffs


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dtype": "float16"}, "linear_dtype bfloat16 takes a float32 model"),
        ({"attention_backend": "torch"}, "with attention_backend 'torch'"),
    ],
)
def test_what_bf16_linear_layers_cannot_serve_is_refused_at_load(folder: Path, options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLM(str(folder), seed=0, linear_dtype="bfloat16", **{**ENGINE, **options})


def test_a_cpu_without_bf16_linear_layers_is_told_so(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batchgen.models.decoder, "bf16_linear_supported", lambda: False)
    with pytest.raises(RuntimeError, match="no bfloat16 linear layers"):
        LLM(str(folder), seed=0, linear_dtype="bfloat16", **ENGINE)


def test_linear_dtype_values() -> None:
    with pytest.raises(ValueError, match="linear_dtype must be float32 or bfloat16"):
        RunnerConfig(linear_dtype="int8")  # type: ignore[arg-type]
    assert RunnerConfig(linear_dtype="float32").linear_dtype == "float32"


def test_the_run_records_bf16_linear_layers_only_where_they_differ_from_the_model_dtype() -> None:
    from batchgen.job.timeline_file import describe_environment

    engine = describe_environment("cpu", "torch.float32", 8, linear_dtype="torch.bfloat16")["engine"]
    assert engine["linear_dtype"] == "torch.bfloat16"
    assert "linear_dtype" not in describe_environment("cpu", "torch.float32", 8, linear_dtype="torch.float32")["engine"]
