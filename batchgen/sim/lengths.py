"""Output lengths in a simulation: which token each simulated sample draws.

Owns the token sources the simulated runner asks for every sample's next token. A sample is
known by its seed (the engine derives it from the job seed and the row id, so it is stable across
engine settings) and by the index of the token it draws:

- `MaxTokens`: always a filler token, so every sample runs to its `max_tokens` (what a job with
  `ignore_eos: true` does; with EOS allowed, the longest a sample can run);
- `RecordedOutputs`: a previous run's outputs, by seed: their token ids when recorded (an exact
  replay), else their length (EOS after the last token of a sample that stopped);
- `LengthDistribution`: a length drawn per sample, by a hash of its seed, from a list of lengths
  (`sharegpt_reply_lengths`: the ShareGPT replies of the packaged data, tokenized).

EOS only ends a sample whose params allow it (the engine's scheduler decides); `max_tokens`
always caps it. Tokens that are not replayed come from a `Filler`: a pseudo-random draw, by seed
and index, from the tokenizer's special tokens that are no EOS. They decode to no text (so no
stop string can match them), and two samples' generated blocks differ as a real model's sampled
outputs do, so the prefix cache sees no hits a real run would not (a constant filler would make
every sample's generated blocks equal, and a recomputed sample would hit another's). Where a
real run's samples do produce equal tokens (forked samples of a peaked model drawing the same
ones, duplicate prompts decoded greedily), only a replay of recorded token ids caches alike.

May import: batchgen.data, batchgen.io (reading output shards), numpy, pyarrow, xxhash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow.parquet as pq
import xxhash

from batchgen.engine.seeding import derive_seed

__all__ = [
    "Filler",
    "LengthDistribution",
    "MaxTokens",
    "Recorded",
    "RecordedOutputs",
    "TokenSource",
    "read_bench_outputs",
    "read_recorded_outputs",
    "sharegpt_reply_lengths",
]

_MASK64 = (1 << 64) - 1

# A length distribution keeps at most this many samples' lengths (the running ones are asked).
_MAX_KEPT_LENGTHS = 65_536

# Past this many recorded token ids in all, a replay keeps lengths only (bounded memory).
_MAX_RECORDED_TOKENS = 20_000_000


class TokenSource(Protocol):
    def token(self, seed: int, index: int) -> int:
        """The token the sample with `seed` draws as its `index`-th generated token."""
        ...

    def tokens(self, seeds: Sequence[int], indices: Sequence[int]) -> list[int]:
        """`token(seeds[i], indices[i])` for each i (a step's decodes at once)."""
        ...


def filler_hash(seeds: Sequence[int], indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """The 64-bit hash of each (seed, index) pair: splitmix64's finalizer over
    `seed * 2**32 + index` (mod 2**64), as unsigned integers. A step's decodes are hashed in a
    few array operations, where a call to a hash function per token cost a tenth of a
    simulation's time. `indices` may be an integer array already (non-negative)."""
    try:
        seed_bits = np.array(seeds, dtype=np.int64).astype(np.uint64)
    except OverflowError:  # a seed outside int64 (the engine's are 63-bit): its low 64 bits
        seed_bits = np.array([seed & _MASK64 for seed in seeds], dtype=np.uint64)
    x = (seed_bits << _U32) + np.asarray(indices).astype(np.uint64)
    x = (x ^ (x >> _U30)) * _MIX1
    x = (x ^ (x >> _U27)) * _MIX2
    result: np.ndarray = x ^ (x >> _U31)
    return result


_U27, _U30, _U31, _U32 = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(32)
# splitmix64's finalizer multipliers, as Python ints (`Filler.token`) and as array scalars
_MIX1_INT, _MIX2_INT = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MIX1, _MIX2 = np.uint64(_MIX1_INT), np.uint64(_MIX2_INT)


@dataclass(frozen=True, slots=True)
class Filler:
    """Tokens for samples that are not replayed: `tokens[filler_hash(seed, index) % len(tokens)]`."""

    tokens: tuple[int, ...]
    _array: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("a filler needs at least one token")
        object.__setattr__(self, "_array", np.array(self.tokens, dtype=np.int64))

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, eos_token_ids: Iterable[int]) -> Filler:
        """The tokenizer's special tokens that are no EOS (they decode to no text); when it has
        none, the first 64 token ids that are no EOS."""
        eos = set(eos_token_ids)
        decoder = tokenizer.backend.get_added_tokens_decoder()
        tokens = tuple(sorted(i for i, t in decoder.items() if t.special and i not in eos))
        return cls(tokens or tuple(i for i in range(64 + len(eos)) if i not in eos)[:64])

    def token(self, seed: int, index: int) -> int:
        # `filler_hash` of one pair in plain integers: a prefill's first token is drawn one at
        # a time, where the array path's set-up cost more than the hash.
        if index < 0:
            raise ValueError("token indices start at 0")
        x = (((seed & _MASK64) << 32) + index) & _MASK64
        x = ((x ^ (x >> 30)) * _MIX1_INT) & _MASK64
        x = ((x ^ (x >> 27)) * _MIX2_INT) & _MASK64
        return self.tokens[(x ^ (x >> 31)) % len(self.tokens)]

    def tokens_of(self, seeds: Sequence[int], indices: Sequence[int]) -> list[int]:
        """The filler token of each (seeds[i], indices[i]); seeds are 64-bit signed integers
        (the engine's are 63-bit), indices from 0."""
        picked: list[int] = self.token_array(seeds, np.array(indices, dtype=np.int64)).tolist()
        return picked

    def token_array(self, seeds: Sequence[int], indices: np.ndarray) -> np.ndarray:
        """`tokens_of` with the indices as an int64 array, as an int64 array."""
        if len(seeds) != len(indices):
            raise ValueError(f"{len(seeds)} seeds but {len(indices)} indices")
        if len(indices) and indices.min() < 0:
            raise ValueError("token indices start at 0")
        picked: np.ndarray = self._array[filler_hash(seeds, indices) % np.uint64(len(self.tokens))]
        return picked


@dataclass(frozen=True, slots=True)
class MaxTokens:
    """Every sample runs to max_tokens."""

    filler: Filler

    def token(self, seed: int, index: int) -> int:
        return self.filler.token(seed, index)

    def tokens(self, seeds: Sequence[int], indices: Sequence[int]) -> list[int]:
        return self.filler.tokens_of(seeds, indices)


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded sample: its generated token ids (None when not recorded), how many it
    generated and whether it stopped (EOS, stop token or string) rather than hit its limit."""

    token_ids: tuple[int, ...] | None
    num_tokens: int
    stopped: bool


class RecordedOutputs:
    """Replays recorded samples by seed; a sample not recorded runs to max_tokens (counted in
    `num_unknown_seeds`)."""

    def __init__(self, outputs: Mapping[int, Recorded], *, filler: Filler, eos: int) -> None:
        self._outputs = dict(outputs)
        self._filler = filler
        self._eos = eos
        self._unknown: set[int] = set()

    def __len__(self) -> int:
        return len(self._outputs)

    @property
    def num_unknown_seeds(self) -> int:
        return len(self._unknown)

    def token(self, seed: int, index: int) -> int:
        rec = self._outputs.get(seed)
        if rec is None:
            self._unknown.add(seed)
            return self._filler.token(seed, index)
        if rec.token_ids is not None and index < len(rec.token_ids):
            return rec.token_ids[index]
        if rec.stopped and index >= rec.num_tokens - 1:
            return self._eos
        return self._filler.token(seed, index)

    def tokens(self, seeds: Sequence[int], indices: Sequence[int]) -> list[int]:
        return [self.token(seed, index) for seed, index in zip(seeds, indices, strict=True)]


class LengthDistribution:
    """Each sample generates a length drawn (by a hash of its seed) from `lengths`, then EOS."""

    def __init__(self, lengths: Sequence[int], *, filler: Filler, eos: int) -> None:
        if not lengths or min(lengths) < 1:
            raise ValueError("a length distribution needs lengths >= 1")
        self._lengths = tuple(int(n) for n in lengths)
        self._filler = filler
        self._eos = eos
        # Asked once a token, so kept; a length is a function of its seed, so the dict is
        # emptied when it holds `_MAX_KEPT_LENGTHS` (a million-row job's samples would stay).
        self._by_seed: dict[int, int] = {}

    def length(self, seed: int) -> int:
        length = self._by_seed.get(seed)
        if length is None:
            length = self._lengths[xxhash.xxh64_intdigest(seed.to_bytes(8, "little")) % len(self._lengths)]
            if len(self._by_seed) >= _MAX_KEPT_LENGTHS:
                self._by_seed.clear()
            self._by_seed[seed] = length
        return length

    def token(self, seed: int, index: int) -> int:
        length = self._by_seed.get(seed)
        if length is None:
            length = self.length(seed)
        return self._eos if index >= length - 1 else self._filler.token(seed, index)

    def tokens(self, seeds: Sequence[int], indices: Sequence[int]) -> list[int]:
        # A step's decodes at once: their lengths by one C-level pass over the kept ones (a seed
        # not kept is drawn, rarely), then the filler and the EOS test as array operations.
        lengths = list(map(self._by_seed.get, seeds))
        if None in lengths:
            lengths = [self.length(seed) if n is None else n for seed, n in zip(seeds, lengths, strict=True)]
        at = np.array(indices, dtype=np.int64)
        drawn = self._filler.token_array(seeds, at)
        drawn[at >= np.array(lengths, dtype=np.int64) - 1] = self._eos
        result: list[int] = drawn.tolist()
        return result


def read_recorded_outputs(paths: Iterable[Path]) -> dict[int, Recorded]:
    """The samples of a job's output shards (Parquet), by seed; error rows are left out.

    Raises ValueError when two samples share a seed with different outputs (a job whose
    `sampling.seed` gives every row the same seed cannot be replayed by seed)."""
    outputs: dict[int, Recorded] = {}
    budget = _MAX_RECORDED_TOKENS
    for path in paths:
        pf = pq.ParquetFile(path, pre_buffer=False)
        names = set(pf.schema_arrow.names)
        if not {"seed", "finish_reason", "usage"} <= names:
            raise ValueError(f"{path}: not a batchgen output shard (no seed, finish_reason, usage)")
        columns = ["seed", "finish_reason", "usage", *(["output_token_ids"] if "output_token_ids" in names else [])]
        for batch in pf.iter_batches(batch_size=8192, columns=columns, use_threads=False):
            data: dict[str, list[Any]] = batch.to_pydict()
            ids = data.get("output_token_ids") or [None] * batch.num_rows
            for seed, reason, usage, token_ids in zip(data["seed"], data["finish_reason"], data["usage"], ids, strict=True):
                if reason == "error" or seed is None:
                    continue
                kept = None
                if token_ids is not None and budget >= len(token_ids):
                    kept = tuple(token_ids)
                    budget -= len(kept)
                rec = Recorded(kept, int(usage["completion_tokens"]), reason == "stop")
                old = outputs.get(seed)
                if old is not None and (old.num_tokens, old.stopped) != (rec.num_tokens, rec.stopped):
                    raise ValueError(
                        f"{path}: seed {seed} names two samples with different outputs; the run "
                        "gave rows the same seed (sampling.seed), so its outputs cannot be replayed"
                    )
                outputs[seed] = rec
    return outputs


def read_bench_outputs(path: Path, *, engine_seed: int = 0) -> dict[int, Recorded]:
    """The generated token ids of `batchgen bench --outputs-out` (JSON lines in request order),
    by the seed the engine gives request k's sample: its requests are queued in order, so
    request k has request id k and seed derive_seed(derive_seed(engine_seed, k), 0)."""
    import json

    outputs: dict[int, Recorded] = {}
    for k, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        try:
            token_ids = tuple(int(t) for t in json.loads(line)["token_ids"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{k + 1}: not an outputs record ({exc})") from exc
        outputs[derive_seed(derive_seed(engine_seed, k), 0)] = Recorded(token_ids, len(token_ids), True)
    return outputs


def sharegpt_reply_lengths(tokenizer: Any, *, count: int = 2000) -> list[int]:
    """Token lengths of the first `count` ShareGPT replies (first turns of the packaged data),
    encoded with `tokenizer` (its `encode_batch`), plus one for the EOS that ends each."""
    from batchgen.data.sharegpt import iter_sharegpt_prompts

    replies = []
    for prompt in iter_sharegpt_prompts():
        if prompt.reply:
            replies.append(prompt.reply)
            if len(replies) == count:
                break
    encoded = tokenizer.encode_batch(replies, add_special_tokens=False)
    return [len(ids) + 1 for ids in encoded]
