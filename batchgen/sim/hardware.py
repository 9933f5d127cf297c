"""Hardware profiles for the simulator: a machine as a few published numbers and stated factors.

Owns `HardwareProfile` (frozen), the built-in profiles shipped as YAML package data
(`batchgen/sim/profiles/*.yaml`: A100 80GB, H100 SXM, H200, L4) and reading/writing a profile
file (`batchgen simulate --hardware FILE.yaml`, `--calibrate ... --out FILE.yaml`).

A profile file holds exactly the `HardwareProfile` fields; unknown or missing keys are errors
naming the file. Peaks are the vendor's published dense figures for the profile's dtype;
`compute_efficiency` and `memory_efficiency` say how much of them a step attains, stated in the
file with their reason, never hidden in code.

May import: the standard library and yaml. Nothing of batchgen but `_checks`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

__all__ = ["HardwareProfile", "builtin_profiles", "load_hardware", "write_hardware"]

_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One accelerator (or CPU) for the cost model (`batchgen.sim.cost`).

    peak_flops: FLOP/s at `dtype_bytes`-wide weights (dense, no sparsity); memory_bandwidth:
    bytes/s of device memory; memory_bytes: device memory; memory_utilization: the share of it
    weights and KV cache may take (like `gpu_memory_utilization`); kv_cache_bytes: the KV pool
    itself, when known (a calibrated CPU run's pool), else sized from memory; step_overhead_s
    and seq_overhead_s: host time per step and per scheduled sequence (scheduler, step arrays,
    sampling, launch); overlap: compute and memory time overlap (max, a roofline) or add (sum,
    how a calibrated CPU fits best); attention_flops: FLOP/s of attention's (query, key) work
    where it runs at its own rate (a CPU's attention kernel is bound by latency and cache, not by
    the GEMMs' peak; calibration fits it), None: at `peak_flops` like the GEMMs;
    kv_committed_on_write: the KV pool's pages are committed as blocks are first written (a
    CPU), so the engine's block pool reuses written blocks before never-used ones; the
    simulated engine then hands out blocks in that order too.
    """

    name: str
    description: str
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: float
    compute_efficiency: float
    memory_efficiency: float
    step_overhead_s: float
    seq_overhead_s: float
    overlap: bool
    dtype_bytes: int
    memory_utilization: float = 0.9
    kv_cache_bytes: float | None = None
    activation_reserve_bytes: float = 0.0
    attention_flops: float | None = None
    kv_committed_on_write: bool = False

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bandwidth", "memory_bytes"):
            _check_number(self.name, name, getattr(self, name), positive=True)
        for name in ("compute_efficiency", "memory_efficiency", "memory_utilization"):
            value = getattr(self, name)
            _check_number(self.name, name, value, positive=True)
            if value > 1:
                raise ValueError(f"hardware profile {self.name!r}: {name} must be in (0, 1], got {value!r}")
        for name in ("step_overhead_s", "seq_overhead_s", "activation_reserve_bytes"):
            _check_number(self.name, name, getattr(self, name), positive=False)
        for name in ("kv_cache_bytes", "attention_flops"):
            if getattr(self, name) is not None:
                _check_number(self.name, name, getattr(self, name), positive=True)
        for name in ("overlap", "kv_committed_on_write"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"hardware profile {self.name!r}: {name} must be true or false")
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"hardware profile {self.name!r}: dtype_bytes must be 1, 2 or 4")

    @property
    def flops_per_s(self) -> float:
        """FLOP/s a step attains."""
        return self.peak_flops * self.compute_efficiency

    @property
    def attention_flops_per_s(self) -> float:
        """FLOP/s attention attains: `attention_flops` where given, else `flops_per_s`."""
        return self.flops_per_s if self.attention_flops is None else self.attention_flops * self.compute_efficiency

    @property
    def bytes_per_s(self) -> float:
        """Bytes/s a step attains."""
        return self.memory_bandwidth * self.memory_efficiency

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_number(profile: str, name: str, value: object, *, positive: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):  # type: ignore[operator]
        sign = "> 0" if positive else ">= 0"
        raise ValueError(f"hardware profile {profile!r}: {name} must be a number {sign}, got {value!r}")


def builtin_profiles() -> dict[str, Path]:
    """Built-in profile names -> their files (package data)."""
    folder = resources.files("batchgen.sim") / "profiles"
    found = {}
    for entry in folder.iterdir():
        if entry.name.endswith(_SUFFIXES):
            found[entry.name.rsplit(".", 1)[0]] = Path(str(entry))
    return dict(sorted(found.items()))


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A built-in profile by name (`h100-sxm`), or a profile file. Raises ValueError naming the
    file and the key for a bad file, FileNotFoundError (listing the built-ins) when neither."""
    builtins = builtin_profiles()
    path = builtins.get(name_or_path)
    if path is None:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"{name_or_path}: neither a built-in hardware profile ({', '.join(builtins)}) "
                "nor a profile file"
            )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of profile fields")
    known = {f.name for f in fields(HardwareProfile)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        return HardwareProfile(**data)
    except TypeError as exc:  # a required field missing
        raise ValueError(f"{path}: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def write_hardware(path: Path, profile: HardwareProfile, *, comment: str = "") -> Path:
    """Write `profile` as a YAML profile file (a `#` comment block first). Returns the path."""
    header = "".join(f"# {line}\n" for line in comment.splitlines()) if comment else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(profile.as_dict(), sort_keys=False), encoding="utf-8")
    return path
