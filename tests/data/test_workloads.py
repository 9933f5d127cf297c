"""The bench workloads' output lengths: fixed, or each turn's recorded ShareGPT reply (capped)."""

from __future__ import annotations

from typing import Any

import pytest

from batchgen.data.sharegpt import iter_sharegpt_conversations
from batchgen.data.workloads import build_workload


class _WordTokenizer:
    """One token a whitespace-separated word; a chat prompt is its messages' words."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [len(w) for w in text.split()]

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        return [len(w) for m in messages for w in m["content"].split()][:40] or [1]


def _replies(multi_turn: bool) -> dict[str, int]:
    """request id -> the word count of the reply recorded after that turn (0: none)."""
    out: dict[str, int] = {}
    for conv_id, messages in iter_sharegpt_conversations():
        turns = (len(messages) + 1) // 2 if multi_turn else 1
        for turn in range(turns):
            reply = messages[2 * turn + 1]["content"] if 2 * turn + 1 < len(messages) else ""
            out[f"{conv_id}/{turn}"] = len(reply.split())
        if len(out) > 400:
            break
    return out


@pytest.mark.parametrize("workload", ["single-turn", "multi-turn"])
def test_sharegpt_lengths_are_each_turns_reply_capped(workload: str) -> None:
    tok = _WordTokenizer()
    fixed = build_workload(workload, tok, num_requests=40, max_tokens=300)  # type: ignore[arg-type]
    assert {r.max_tokens for r in fixed} == {300}
    varied = build_workload(workload, tok, num_requests=40, max_tokens=300, output_lens="sharegpt")  # type: ignore[arg-type]
    assert [r.prompt_token_ids for r in varied] == [r.prompt_token_ids for r in fixed]
    replies = _replies(workload == "multi-turn")
    expected = [max(1, min(300, replies[r.request_id])) for r in varied]
    assert [r.max_tokens for r in varied] == expected
    assert len(set(expected)) > 10 and 300 in expected  # lengths vary, and some hit the cap
    with pytest.raises(ValueError, match="output_lens"):
        build_workload(workload, tok, num_requests=4, max_tokens=8, output_lens="zipf")  # type: ignore[arg-type]
