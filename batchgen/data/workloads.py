"""Benchmark workloads built from ShareGPT conversations, as exact token-id requests.

Two workloads, both chat-templated with the model's template and fed to every engine as token
ids (so tokenizer differences cannot enter a comparison):

- `single-turn`: the first human turn of each conversation, prompts of at most 512 tokens.
- `multi-turn`: every prefix of a conversation that ends on a human turn, i.e. the history a
  chat server would send at each turn; later turns of a conversation share long prefixes
  with earlier ones, which is where a prefix cache pays.

    conversation:  | u0 | a0 | u1 | a1 | u2 |
    requests:      | u0 |
                   | u0 | a0 | u1 |
                   | u0 | a0 | u1 | a1 | u2 |

Each request's new-token limit is `max_tokens` ("fixed"), or with output_lens "sharegpt" the
token length of the reply the conversation recorded after that turn, capped at `max_tokens`
(what vLLM's and SGLang's ShareGPT benchmarks do), so lengths vary as in real traffic.

Requests are written to and read from JSON lines, one request a line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .sharegpt import iter_sharegpt_conversations

__all__ = [
    "WORKLOADS",
    "BenchRequest",
    "Workload",
    "build_workload",
    "read_requests",
    "write_requests",
]

Workload = Literal["single-turn", "multi-turn"]
WORKLOADS: tuple[Workload, ...] = ("single-turn", "multi-turn")
OUTPUT_LENS = ("fixed", "sharegpt")
_MAX_SINGLE_TURN_TOKENS = 512
_MIN_CHARS = 16


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request: its name (conversation id and turn), prompt token ids, new-token limit."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


def build_workload(
    name: Workload,
    tokenizer: Any,
    *,
    num_requests: int,
    max_tokens: int,
    max_model_len: int = 2048,
    output_lens: str = "fixed",
) -> list[BenchRequest]:
    """The first `num_requests` requests of the workload, in file order.

    `tokenizer` needs `encode_chat(messages)` (and `encode(text, add_special_tokens=False)` for
    output_lens "sharegpt": a turn without a recorded reply then gets 1 token). Multi-turn
    prompts are cut where prompt plus `max_tokens` would pass `max_model_len`. Raises
    ValueError for an unknown workload or output_lens, or when the dataset holds fewer requests
    than asked for.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    if output_lens not in OUTPUT_LENS:
        raise ValueError(f"output_lens must be one of {', '.join(OUTPUT_LENS)}, got {output_lens!r}")

    def limit_after(messages: list[dict[str, Any]], turn: int) -> int:
        if output_lens == "fixed":
            return max_tokens
        reply = messages[2 * turn + 1]["content"] if 2 * turn + 1 < len(messages) else ""
        return max(1, min(max_tokens, len(tokenizer.encode(reply, add_special_tokens=False))))

    if num_requests < 1 or max_tokens < 1:
        raise ValueError("num_requests and max_tokens must be >= 1")
    limit = _MAX_SINGLE_TURN_TOKENS if name == "single-turn" else max_model_len - max_tokens
    requests: list[BenchRequest] = []
    for conv_id, messages in iter_sharegpt_conversations():
        if name == "single-turn":
            if len(messages[0]["content"]) < _MIN_CHARS:
                continue
            ids = tokenizer.encode_chat(messages[:1])
            if len(ids) <= limit:
                requests.append(BenchRequest(f"{conv_id}/0", tuple(ids), limit_after(messages, 0)))
        else:
            num_user_turns = (len(messages) + 1) // 2
            if num_user_turns < 2:
                continue
            for turn in range(num_user_turns):
                ids = tokenizer.encode_chat(messages[: 2 * turn + 1])
                if len(ids) > limit:
                    break  # later turns only grow
                requests.append(BenchRequest(f"{conv_id}/{turn}", tuple(ids), limit_after(messages, turn)))
                if len(requests) == num_requests:
                    break
        if len(requests) == num_requests:
            return requests
    raise ValueError(f"the {name} workload holds only {len(requests)} requests, {num_requests} asked for")


def write_requests(path: Path, requests: Iterable[BenchRequest]) -> None:
    """Write requests as JSON lines (creates the parent folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in requests:
            f.write(
                json.dumps(
                    {"request_id": r.request_id, "prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens}
                )
                + "\n"
            )


def read_requests(path: Path) -> list[BenchRequest]:
    """Requests written by `write_requests`; raises ValueError naming the line of a bad record."""
    requests = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            requests.append(
                BenchRequest(
                    str(record["request_id"]),
                    tuple(int(t) for t in record["prompt_token_ids"]),
                    int(record["max_tokens"]),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: not a request record ({exc})") from exc
    return requests
