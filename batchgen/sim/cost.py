"""The cost model: how long one engine step takes, from the work its plan holds.

Owns `ModelShape` (the sizes that cost time, from a `ModelConfig`: a checkpoint or a config.json
alone), `StepWork` (the work counts of a step or of a stretch of steps) and `CostModel`.

The formula, per step (a roofline of compute and memory time plus a fixed host overhead):

    flops   = 2 * P_body * T  +  2 * H * V * S          (the GEMMs)
    attn    = 4 * L * Hq * D * A                        (attention's scores and weighted sum)
    bytes   = W  +  KV * (C + T)
    t_step  = N * step_overhead_s + R * seq_overhead_s
              + combine(flops / (peak_flops * compute_efficiency)
                          + attn / (attention_flops * compute_efficiency),
                        bytes / (memory_bandwidth * memory_efficiency))

    T tokens computed (every token runs through the projections and the MLP), S logits rows
    (chunks that sample: the LM head), A attention (query, key) pairs (a chunk of q tokens after
    s computed ones: q*s + q(q+1)/2), C KV tokens attention reads (s + q per chunk), R sequences
    in the step, N steps; P_body the parameters of the layers (q, k, v, o, gate, up, down), H the
    hidden size, V the vocabulary, L layers, Hq query heads, D head size; W the weight bytes
    (layers and LM head, read once per step), KV the KV bytes of one token (2 * L * Hkv * D * b).
    combine is max when the profile says compute and memory overlap (a GPU), their sum otherwise
    (what a calibrated CPU fits). attention_flops is peak_flops unless the profile sets it (a
    profile file may state attention's own rate; calibration does not fit one: see
    `batchgen.sim.calibrate`). Norms, RoPE, the embedding gather and activations are left out.

Every count is a sum over steps, so the same formula prices a timeline interval (calibration)
as the sum of its steps when combine is the sum; with max it is exact per step only.

May import: batchgen.engine (StepPlan), batchgen.models (ModelConfig), batchgen.sim.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchgen.engine.step_plan import StepPlan
from batchgen.models.config import ModelConfig
from batchgen.sim.hardware import HardwareProfile

__all__ = ["CostModel", "ModelShape", "StepCost", "StepWork", "kv_pool_blocks"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The sizes of a decoder-only transformer that decide a step's cost."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, config: ModelConfig) -> ModelShape:
        return cls(
            num_layers=config.num_layers,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            vocab_size=config.vocab_size,
            tie_word_embeddings=config.tie_word_embeddings,
        )

    @property
    def body_params(self) -> int:
        """Parameters of the layers' matrices (q, k, v, o, gate, up, down)."""
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attention + mlp)

    @property
    def lm_head_params(self) -> int:
        return self.hidden_size * self.vocab_size

    def weight_bytes(self, dtype_bytes: int) -> int:
        """Device bytes of the weights (an untied LM head is a second vocab x hidden matrix)."""
        embeddings = self.lm_head_params * (1 if self.tie_word_embeddings else 2)
        return (self.body_params + embeddings) * dtype_bytes

    def step_weight_bytes(self, dtype_bytes: int) -> int:
        """Weight bytes a step reads: the layers and the LM head."""
        return (self.body_params + self.lm_head_params) * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True, slots=True)
class StepWork:
    """Work counts of `num_steps` steps (see the module docstring's T, S, A, C, R, N)."""

    num_steps: int
    num_seqs: int
    num_tokens: int
    num_sampled: int
    context_tokens: int
    attention_pairs: int

    @classmethod
    def of_plan(cls, plan: StepPlan) -> StepWork:
        """The work of one step's plan."""
        return cls(
            1,
            plan.num_chunks,
            plan.num_tokens,
            plan.num_sampling_chunks,
            plan.num_context_tokens,
            plan.num_attention_pairs,
        )


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds of a step (or a stretch of steps), by part."""

    overhead_s: float
    compute_s: float
    memory_s: float
    total_s: float


class CostModel:
    """Prices `StepWork` on one profile for one model (the module docstring's formula)."""

    def __init__(self, shape: ModelShape, profile: HardwareProfile) -> None:
        self.shape = shape
        self.profile = profile
        s, b = shape, profile.dtype_bytes
        self._flops_per_token = 2.0 * s.body_params
        self._flops_per_row = 2.0 * s.lm_head_params
        self._attention_flops_per_pair = 4.0 * s.num_layers * s.num_heads * s.head_dim
        self._weight_bytes = float(s.step_weight_bytes(b))
        self._kv_bytes = float(s.kv_bytes_per_token(b))

    def flops(self, work: StepWork) -> float:
        """The GEMMs' FLOPs (the layers' projections and MLP, the LM head)."""
        return self._flops_per_token * work.num_tokens + self._flops_per_row * work.num_sampled

    def attention_flops(self, work: StepWork) -> float:
        """Attention's FLOPs: scores and weighted sum over the (query, key) pairs."""
        return self._attention_flops_per_pair * work.attention_pairs

    def bytes(self, work: StepWork) -> float:
        return self._weight_bytes * work.num_steps + self._kv_bytes * (work.context_tokens + work.num_tokens)

    def cost(self, work: StepWork) -> StepCost:
        p = self.profile
        overhead = p.step_overhead_s * work.num_steps + p.seq_overhead_s * work.num_seqs
        compute = self.flops(work) / p.flops_per_s + self.attention_flops(work) / p.attention_flops_per_s
        memory = self.bytes(work) / p.bytes_per_s
        busy = max(compute, memory) if p.overlap else compute + memory
        return StepCost(overhead, compute, memory, overhead + busy)

    def seconds(self, work: StepWork) -> float:
        return self.cost(work).total_s


def kv_pool_blocks(profile: HardwareProfile, shape: ModelShape, block_size: int) -> int:
    """KV blocks of `block_size` tokens the profile's memory holds next to the weights (or its
    stated `kv_cache_bytes`). Raises ValueError when the weights leave no room."""
    block_bytes = shape.kv_bytes_per_token(profile.dtype_bytes) * block_size
    if profile.kv_cache_bytes is not None:
        budget = profile.kv_cache_bytes
    else:
        weights = shape.weight_bytes(profile.dtype_bytes)
        budget = profile.memory_bytes * profile.memory_utilization - weights - profile.activation_reserve_bytes
        if budget < block_bytes:
            raise ValueError(
                f"the model's weights ({weights / 2**30:.1f} GiB) leave no room for a KV cache in "
                f"{profile.memory_bytes * profile.memory_utilization / 2**30:.1f} GiB of "
                f"{profile.name} (memory_utilization {profile.memory_utilization})"
            )
    return int(budget // block_bytes)
