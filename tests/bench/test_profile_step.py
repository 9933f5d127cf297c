"""jobs/bench/profile_step.py's breakdown without the profiler: every kernel call of the model is
timed by part, the parts account for the step, and the model's functions are put back after."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

import batchgen.models.attention as attention_module
import batchgen.models.layers as layers_module
import batchgen.models.mlp as mlp_module
from batchgen.engine.config import CacheConfig, RunnerConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.sampling_params import SamplingParams
from batchgen.models.checkpoint import load_checkpoint
from tests.tiny_models import make_tiny_hf_folder

_SCRIPT = Path(__file__).resolve().parents[2] / "jobs" / "bench" / "profile_step.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("profile_step", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wall_clock_by_part_times_each_kernel_call_and_puts_the_model_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script()
    folder = make_tiny_hf_folder(tmp_path / "tiny")
    engine = LLMEngine(
        load_checkpoint(str(folder)),
        scheduler_config=SchedulerConfig(max_num_seqs=4),
        cache_config=CacheConfig(num_kv_blocks=64),
        runner_config=RunnerConfig(device="cpu", max_model_len=128),
    )
    for i in range(4):
        engine.add_request([100 + i, 200, 300, 400 + i], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    engine.step()  # the prompts
    originals = {(m, n): getattr(m, n) for m, n, _ in script._PARTS}
    model = engine.runner.model
    before = engine.stats().generation_tokens

    wall, parts = script._wall_clock_by_part(engine, 3)

    assert engine.stats().generation_tokens - before == 3 * 4  # three decode steps of the four rows ran
    assert all(getattr(m, n) is run for (m, n), run in originals.items())
    assert not {"final_hidden", "greedy_tokens", "logits"} & set(vars(model))  # the instance wrappers gone
    assert set(parts) == {"projections", "attention", "kv_write", "norm_rope", "rest of the layers", "LM head", "outside the model"}
    for part in ("projections", "attention", "kv_write", "norm_rope", "LM head"):
        assert parts[part] > 0, part  # the model's calls were seen
    assert all(secs >= 0 for secs in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(wall)
    out = capsys.readouterr().out
    assert re.search(r"step [\d.]+ ms", out) and re.search(r"projections at \d+ GFLOP/s", out)


def test_the_parts_name_functions_the_model_calls() -> None:
    # a part whose function the model no longer imports under that name would time nothing
    for module, name, _ in _script()._PARTS:
        assert module in (attention_module, layers_module, mlp_module)
        assert callable(getattr(module, name))
