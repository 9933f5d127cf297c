"""A simulated engine: the real `LLMEngine` with the simulated runner and clock injected.

Owns reading a model for a simulation without its weights (`load_sim_model`: the config and
tokenizer of a Hugging Face folder or a GGUF file, or the shapes of a `config.json` alone) and
building the engine (`build_sim_engine`): the KV pool is sized for the hardware profile (or the
engine options' own size), the runner prices each step with the cost model, the clock is the
simulation's. Nothing here schedules: the engine's scheduler and KV manager do.

May import: batchgen.engine, batchgen.models, batchgen.tokenizer, batchgen.sim.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from batchgen.engine.config import EngineConfigs
from batchgen.engine.llm_engine import LLMEngine
from batchgen.models.checkpoint import Checkpoint, default_model_path
from batchgen.models.config import ModelConfig
from batchgen.models.gguf_header import GGUFHeader
from batchgen.models.gguf_loader import read_gguf_config
from batchgen.sim.cost import CostModel, ModelShape, kv_pool_blocks
from batchgen.sim.hardware import HardwareProfile
from batchgen.sim.lengths import TokenSource
from batchgen.sim.runner import SimClock, SimulatedRunner
from batchgen.tokenizer.tokenizer import Tokenizer

__all__ = ["SimEngine", "SimModel", "build_sim_engine", "load_sim_model", "load_sim_shape"]


@dataclass(frozen=True, slots=True)
class SimModel:
    """A model as a simulation needs it: `config` is what the engine sees (EOS ids, vocabulary,
    positions: the tokenizer's model), `shape` what the cost model prices (the same model, or
    the `config.json` given for sizing), `source` says where both came from."""

    config: ModelConfig
    shape: ModelShape
    tokenizer: Tokenizer
    source: str


def _read_config_json(path: Path) -> ModelConfig:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable config.json ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return ModelConfig.from_hf_dict(data, source=str(path))


def _read_model(model: str | None) -> tuple[ModelConfig, Tokenizer, Path]:
    """Config and tokenizer of a model path (None: the built-in model), weights unread."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{config_file}: not found; a Hugging Face model folder needs config.json")
        return _read_config_json(config_file), Tokenizer.from_hf_folder(path), path
    if path.is_file() and path.suffix.lower() == ".gguf":
        # The header alone: a GGUFReader would build numpy views of every vocabulary string
        # (about 5 s for the built-in model); no weight is read here.
        reader = GGUFHeader(path)
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = None if tokens is None else len(tokens.contents())
        return read_gguf_config(reader, path, tokenizer_vocab_size=vocab), Tokenizer.from_gguf(reader), path
    raise FileNotFoundError(f"{path}: expected a .gguf file or a Hugging Face model folder")


def load_sim_model(model: str | None, *, model_config: Path | None = None) -> SimModel:
    """The job's model (its tokenizer prepares the rows), priced as itself or, with
    `model_config`, as the model that config.json describes (an 8B or 70B model sized without
    its weights; prompts keep the job's tokenizer). Raises FileNotFoundError / ValueError."""
    config, tokenizer, path = _read_model(model)
    if model_config is None:
        return SimModel(config, ModelShape.from_config(config), tokenizer, str(path))
    sized = _read_config_json(model_config)
    # The engine checks prompts against the tokenizer's vocabulary and stops on its EOS ids; the
    # positions and the cost are the sized model's.
    seen = dataclasses.replace(
        config,
        vocab_size=max(config.vocab_size, sized.vocab_size),
        max_position_embeddings=sized.max_position_embeddings,
        sliding_window=sized.sliding_window,
    )
    return SimModel(seen, ModelShape.from_config(sized), tokenizer, f"{model_config} (tokenizer: {path})")


def load_sim_shape(model: str | None, *, model_config: Path | None = None) -> ModelShape:
    """The shape that prices a model's steps: `model_config`'s alone when given (no tokenizer
    is needed, so `model` need not be on this machine: a GPU run's model folder was the
    device's), else `model`'s. Raises FileNotFoundError / ValueError."""
    if model_config is not None:
        return ModelShape.from_config(_read_config_json(model_config))
    config, _, _ = _read_model(model)
    return ModelShape.from_config(config)


@dataclass(frozen=True, slots=True)
class SimEngine:
    """An engine on a simulated clock and the runner that prices its steps."""

    engine: LLMEngine
    runner: SimulatedRunner
    clock: SimClock
    profile: HardwareProfile


def build_sim_engine(
    model: SimModel,
    configs: EngineConfigs,
    profile: HardwareProfile,
    tokens: TokenSource,
    *,
    seed: int = 0,
    timeline_max_rows: int = 1024,
    start_time: float = 0.0,
) -> SimEngine:
    """The engine of `configs` on `profile`. Its KV pool: `num_kv_blocks` or
    `kv_cache_memory_bytes` of the options when set, else what the profile's memory holds next
    to the weights. Raises ValueError for sizes that cannot work (the engine's messages)."""
    cache = configs.cache
    block_bytes = model.shape.kv_bytes_per_token(profile.dtype_bytes) * cache.block_size
    if cache.num_kv_blocks is not None:
        num_blocks = cache.num_kv_blocks
    elif cache.kv_cache_memory_bytes is not None:
        num_blocks = cache.kv_cache_memory_bytes // block_bytes
    else:
        num_blocks = kv_pool_blocks(profile, model.shape, cache.block_size)
    clock = SimClock(start_time)
    runner = SimulatedRunner(CostModel(model.shape, profile), clock, tokens)
    checkpoint = Checkpoint(model.config, {}, model.tokenizer, Path(model.source), "simulated")
    engine = LLMEngine(
        checkpoint,
        scheduler_config=configs.scheduler,
        cache_config=cache,
        runner_config=configs.runner,
        seed=seed,
        timeline_max_rows=timeline_max_rows,
        runner=runner,
        num_kv_blocks=num_blocks,
        clock=clock.now,
        reuse_written_blocks_first=profile.kv_committed_on_write,
        decode_text=False,
    )
    return SimEngine(engine, runner, clock, profile)
