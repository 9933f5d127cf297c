"""`DecoderModel`: a decoder-only model of any supported family over a flat batch of tokens.

The family (`registry.family_for(config.architecture)`) builds the parts from the shared blocks;
this class runs them the same way for every family: embedding lookup (scaled when the family
says so), the layers with the residual stream fused into the norms, the final norm of the tokens
that sample, the output projection and an optional final soft cap. Projections, MLPs and norms
run over all of a step's tokens together; attention reads each sequence's K/V through its block
table (batchgen.kernels). The KV pool tensors are owned by the runner and passed in.

On CPU in float32 the projections run with weights packed once (MKL's packed sgemm on Intel
CPUs, oneDNN's on others; kernels/linear_cpu.py); the "torch" backend keeps F.linear, the
reference path. When a model cannot take a backend's fast path, `fast_path_notes` says why, and
the notice is logged once, at load (logger "batchgen.models").

Imports torch, `batchgen.kernels` and the rest of `batchgen.models`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from batchgen.kernels import (
    AttentionMetadata,
    Backend,
    GreedyHead,
    argmax,
    bf16_linear_supported,
    greedy_head_supported,
    greedy_screen_available,
    greedy_tokens,
    keep_freed_memory,
    linear,
    pack_greedy_head,
    pack_linear_weight,
    packed_linear_library,
    prepare_backend,
    resolve_backend,
    rms_norm,
)

from .attention import StepInputs, Weight
from .config import ModelConfig
from .family import BuildOptions, WeightReader
from .registry import family_for

__all__ = ["DecoderModel"]

_LOG = logging.getLogger("batchgen.models")


# The largest head_dim the Triton attention kernels take (kernels/triton_attention.py).
_TRITON_MAX_HEAD_DIM = 256


def _unpacked_note(dtype: torch.dtype) -> str:
    """Why a CPU model (on an automatic or compiled backend) runs its linear layers unpacked."""
    if dtype != torch.float32:
        return (
            f"the linear layers run unpacked (F.linear) and attention, norms and rotary embedding on "
            f"the PyTorch path: the packed weights and the compiled kernel take float32, the model "
            f"runs in {dtype}"
        )
    return (
        "the linear layers run unpacked (F.linear): this torch build has neither MKL nor oneDNN to "
        "pack weights"
    )


class DecoderModel:
    """Weights plus a forward pass; holds no per-step state."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, torch.Tensor],
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        attention_backend: Backend | None = None,
        linear_dtype: torch.dtype | None = None,
        greedy_screen: bool = True,
    ) -> None:
        """Builds the model of `config.architecture` from Hugging Face-named `weights`.
        `linear_dtype` bfloat16 runs the packed linear layers' products in bfloat16 (a float32
        CPU model on a compiled backend only; see kernels/linear_cpu.py). Raises KeyError for a
        missing tensor, ValueError for an architecture without a family or a `linear_dtype` this
        model cannot take, and RuntimeError for an explicit "cpu" backend whose kernel cannot be
        built or a CPU without bfloat16 linear layers. `greedy_screen`: where this machine can screen a
        float32 LM head (`greedy_screen_available`), pack the head for batchgen's kernel and keep an
        int8 or bfloat16 copy of it for `greedy_tokens` (see kernels/greedy_cpu.py; the tokens are
        the float32 head's either way)."""
        self.config = config
        self.device = device
        self.dtype = dtype
        self.linear_dtype = dtype if linear_dtype is None else linear_dtype
        notes: list[str] = []
        self._backend = self._choose_backend(attention_backend, notes)
        options = BuildOptions(device=device, dtype=dtype, max_model_len=max_model_len)
        parts = family_for(config.architecture).build(config, WeightReader(weights, options), options)
        self.embed = parts.embed
        self.embed_scale = parts.embed_scale
        self.layers = parts.layers
        self.norm = parts.final_norm
        self.final_logit_softcap = parts.final_logit_softcap
        self.lm_head: Weight = self.embed if parts.lm_head is None else parts.lm_head
        # The LM head's greedy screen (`greedy_tokens`: int8 or bfloat16 estimates), where it applies.
        self._greedy_head: GreedyHead | None = None
        prepare_backend(self._backend, device)  # the CPU kernel's build, here, not in a first step
        if device.type == "cpu":
            keep_freed_memory()  # each layer's large activations reuse freed heap, not fresh pages
        self.packed_linear = (
            device.type == "cpu"
            and dtype == torch.float32
            and self._backend != "torch"
            and packed_linear_library() is not None
        )
        if self.linear_dtype != dtype:
            self._check_linear_dtype()
        if self.packed_linear:
            for layer in self.layers:
                layer.pack(self.linear_dtype)
            head_weight = self.embed if parts.lm_head is None else parts.lm_head
            screened = (
                greedy_screen
                and self.final_logit_softcap is None
                and self.linear_dtype == torch.float32
                and greedy_screen_available()
            )
            # A screened head is packed for batchgen's kernel whatever library the projections use
            # (the choice of `packed_linear_library`): the screen checks its candidates with that
            # kernel's arithmetic.
            head_library = "batchgen" if screened else None
            self.lm_head = pack_linear_weight(head_weight, head_library, compute_dtype=self.linear_dtype)
            if screened and greedy_head_supported(self.lm_head):
                # a tied head's rows are the embedding table, kept anyway
                self._greedy_head = pack_greedy_head(self.lm_head, head_weight, keep_rows=parts.lm_head is None)
        elif device.type == "cpu" and self._backend != "torch":
            notes.append(_unpacked_note(dtype))
        self.fast_path_notes = tuple(notes)
        for note in notes:
            _LOG.warning("%s model: %s", config.architecture, note)

    def _check_linear_dtype(self) -> None:
        if self.linear_dtype != torch.bfloat16 or self.dtype != torch.float32:
            raise ValueError(
                f"linear_dtype {self.linear_dtype} with a {self.dtype} model: linear_dtype bfloat16 takes a "
                "float32 model (dtype float32, the CPU default)"
            )
        if not self.packed_linear:
            where = "on the GPU" if self.device.type != "cpu" else "with attention_backend 'torch'"
            raise ValueError(f"linear_dtype bfloat16 packs the CPU's linear layers, which this model does not ({where})")
        if not bf16_linear_supported():
            raise RuntimeError(
                "linear_dtype bfloat16: this CPU or torch build has no bfloat16 linear layers (batchgen's need AVX512-BF16, oneDNN's AVX-512)"
            )

    def _choose_backend(self, requested: Backend | None, notes: list[str]) -> Backend | None:
        """The attention backend: `requested`, except that an automatic choice of Triton for a
        head_dim its kernels do not take becomes PyTorch, with a note."""
        if requested is None and self.device.type == "cuda" and self.config.head_dim > _TRITON_MAX_HEAD_DIM:
            notes.append(
                f"attention runs on the PyTorch path: the Triton kernels take a head_dim of at most "
                f"{_TRITON_MAX_HEAD_DIM}, this model has {self.config.head_dim}"
            )
            return "torch"
        if requested is None and self.device.type == "cpu" and resolve_backend(None, self.device) == "torch":
            notes.append("attention runs on the PyTorch path: the compiled CPU kernel cannot be built here")
        return requested

    @property
    def attention_backend(self) -> Backend | None:
        """The attention backend the model runs (None: chosen per call from the device and dtype)."""
        return self._backend

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.config
        return 2 * c.num_layers * c.num_kv_heads * c.head_dim * self.embed.element_size()

    @property
    def has_greedy_head(self) -> bool:
        """Whether `greedy_tokens` skips most of the float32 LM head (else it computes the logits)."""
        return self._greedy_head is not None

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (float32, [len(logits_indices), vocab]) of the selected tokens.

        Writes each layer's new K/V into kv_caches at meta.slot_mapping.
        """
        return self.logits(self.final_hidden(input_ids, positions, kv_caches, meta, logits_indices))

    @torch.inference_mode()
    def greedy_tokens(self, last: torch.Tensor) -> torch.Tensor:
        """`argmax(logits(last), dim=-1)` (int64 [rows]) for `final_hidden`'s output: the greedy
        tokens, the same ones, through the bfloat16 screen where the model has it."""
        tokens: torch.Tensor = (
            argmax(self.logits(last)) if self._greedy_head is None else greedy_tokens(last, self._greedy_head)
        )
        return tokens

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        """The LM head's logits (float32) for `final_hidden`'s output, soft-capped where the model
        caps them."""
        logits: torch.Tensor = linear(last, self.lm_head).float()
        cap = self.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.inference_mode()
    def final_hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """The final norm's output at the selected tokens, what the LM head takes (`logits`,
        `greedy_tokens`). Writes each layer's new K/V as `forward` does."""
        backend = self._backend
        step = StepInputs(positions, meta, backend)
        hidden = self.embed.index_select(0, input_ids)
        if self.embed_scale is not None:
            hidden = hidden * self.embed_scale
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer.forward(hidden, residual, kv_cache, step)
        if residual is None:
            raise RuntimeError("the model has no layers")
        last, _ = rms_norm(
            hidden.index_select(0, logits_indices),
            self.norm,
            self.config.rms_norm_eps,
            residual.index_select(0, logits_indices),
            backend=backend,
        )
        out: torch.Tensor = last
        return out
