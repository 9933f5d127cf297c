"""Setup checks of a job that need the machine or the model: the device, the attention backend
and loading the model, each turned into an `InputError` that names the job file's key or the
model file (the CLI prints it without a traceback and exits with code 2).

May import: torch, batchgen.io, batchgen.models, batchgen.job.config.
"""

from __future__ import annotations

import torch

from batchgen.io import InputError
from batchgen.job.config import JobConfig
from batchgen.models.checkpoint import Checkpoint, load_checkpoint

__all__ = ["check_device", "load_model"]


def check_device(config: JobConfig) -> None:
    """Refuse ``engine.device: cuda[:N]`` without that CUDA device, and
    ``engine.attention_backend: triton`` where the model runs on the CPU."""
    device = config.runner.device
    has_cuda = torch.cuda.is_available()
    if device is not None and device.startswith("cuda"):
        if not has_cuda:
            raise InputError(
                f"{config.source}: engine.device: {device!r}, but this machine has no CUDA "
                f"device usable by torch {torch.__version__}; use device: cpu (or null to pick "
                "cuda only when available)"
            )
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise InputError(
                f"{config.source}: engine.device: {device!r}, but this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    on_cpu = device == "cpu" or (device is None and not has_cuda)
    if config.runner.attention_backend == "triton" and on_cpu:
        raise InputError(
            f"{config.source}: engine.attention_backend: 'triton' needs a CUDA device, and the "
            "model runs on the CPU here; use attention_backend: torch (or null)"
        )


def load_model(config: JobConfig) -> Checkpoint:
    """Load the job's model. Raises InputError naming ``model`` and the path when the file is
    missing or cannot be loaded as a model, whatever the loader raised (its error is chained)."""
    path = None if config.model is None else config.resolve_path(config.model)
    where = f"{config.source}: model: {path if path is not None else 'the built-in model'}"
    if path is not None and not path.exists():
        raise InputError(f"{where} does not exist")
    try:
        return load_checkpoint(None if path is None else str(path))
    except Exception as exc:  # a garbage file can fail anywhere in a parser: all are setup errors
        raise InputError(f"{where}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
