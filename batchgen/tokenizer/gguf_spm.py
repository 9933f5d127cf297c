"""A GGUF file's SentencePiece vocabulary (`tokenizer.ggml.model == "llama"`) as a `tokenizers` BPE.

llama.cpp's converter stores a SentencePiece BPE model (Llama 2, Mistral 7B, Mixtral, Phi-3-mini,
Gemma 2 and 3) as three parallel lists: the pieces (`tokenizer.ggml.tokens`), their `scores` and
their `token_type`s, and no merges. SentencePiece and llama.cpp encode a stretch of text between
special tokens as

    " " -> "▁", and "▁" in front when add_space_prefix    "Hi  you" -> "▁Hi▁▁you"
    one symbol per character                             ▁ H i ▁ ▁ y o u
    merge, again and again, the adjacent pair whose      ▁H i ▁ ▁ y o u -> ... -> ▁Hi ▁ ▁you
      concatenation is a normal piece of the highest
      score, until no pair is one
    a symbol that is no piece -> its UTF-8 bytes as the byte pieces <0x..> (token type 6)

The same runs as a `tokenizers` BPE whose merges are every split of every normal piece into two
normal pieces, ranked by the score of the piece they make (higher first, then lower id), with
byte fallback and a normalizer doing the first step. One difference is left: where two overlapping
pairs make the same piece (x y z with x+y == y+z), SentencePiece merges the left one and the BPE
the one whose split ranks first; trained vocabularies practically never reach it.

Each stretch between special or user-defined tokens gets its own "▁" prefix, as llama.cpp adds
one after every such token. Decoding turns "▁" back into spaces, joins byte pieces into UTF-8 and
drops the one leading space the prefix added.

Imports `tokenizers` only.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, normalizers
from tokenizers.models import BPE

__all__ = ["TOKEN_TYPE_NORMAL", "spm_backend"]

# GGUF token types (llama.cpp's llama_token_type); a file without types has only normal pieces.
TOKEN_TYPE_NORMAL = 1

_SPACE = "▁"


def _merges(
    tokens: Sequence[str], scores: Sequence[float], token_types: Sequence[int]
) -> list[tuple[str, str]]:
    """Every split of a normal piece into two normal pieces, best merged piece first."""
    normal: dict[str, int] = {}
    for token_id, (token, kind) in enumerate(zip(tokens, token_types, strict=True)):
        if kind == TOKEN_TYPE_NORMAL:
            normal[token] = token_id  # a repeated piece keeps its last id, as llama.cpp looks up
    ranked: list[tuple[float, int, int, str, str]] = []
    for token, token_id in normal.items():
        for split in range(1, len(token)):
            left, right = token[:split], token[split:]
            left_id = normal.get(left)
            if left_id is not None and right in normal:
                ranked.append((-scores[token_id], token_id, left_id, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def spm_backend(
    tokens: Sequence[str],
    scores: Sequence[float],
    token_types: Sequence[int],
    *,
    unk_token: str | None,
    add_space_prefix: bool,
) -> _Backend:
    """The BPE model, normalizer and decoder of the vocabulary (module docstring).

    `token_types` has one entry per token (all `TOKEN_TYPE_NORMAL` when the file has none).
    Special and user-defined tokens are not added here (the caller adds them), nor is BOS/EOS.
    Raises ValueError when the three lists differ in length.
    """
    if not len(tokens) == len(scores) == len(token_types):
        raise ValueError(
            f"{len(tokens)} tokens, {len(scores)} scores and {len(token_types)} token types"
        )
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    backend = _Backend(
        BPE(
            vocab=vocab,
            merges=_merges(tokens, scores, token_types),
            unk_token=unk_token,
            fuse_unk=True,
            byte_fallback=True,
            dropout=None,
        )
    )
    # No pre-tokenizer: SentencePiece merges over the whole stretch, spaces included.
    steps: list[normalizers.Normalizer] = []
    if add_space_prefix:
        # Prepend runs on each stretch between added tokens: llama.cpp's prefix after each.
        steps.append(normalizers.Prepend(_SPACE))
    steps.append(normalizers.Replace(" ", _SPACE))
    backend.normalizer = normalizers.Sequence(steps)
    decode_steps: list[decoders.Decoder] = [
        decoders.Replace(_SPACE, " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
    ]
    if add_space_prefix:
        # After Fuse there is one string, so Strip removes only the text's first space.
        decode_steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(decode_steps)
    return backend
