"""OpenAI Batch API files as a job's source and sink (`batchgen run-batch`, ``format:
openai_jsonl``).

Requests come from `batchgen.io.openai_batch` as Arrow rows (custom_id as the id, url, model and
line number as passthrough values); this module turns the output rows of each request into
one response line: ``{id, custom_id, response: {status_code, request_id, body}, error}``, with
an OpenAI-shaped ``chat.completion`` or ``text_completion`` object as the body (choices,
finish_reason, usage with ``prompt_tokens_details.cached_tokens``), or a 400 response with an
``error`` object for a row that failed. A completions request with ``echo`` gets its prompt
before the text and, with ``logprobs``, the prompt's tokens first in ``logprobs`` (the first
token's log-probability and top ones null, as OpenAI writes them); with ``max_tokens: 0`` the
prompt is the whole answer (finish_reason "length", no completion tokens). Lines are written in input order, one per request,
to a file committed atomically like a Parquet shard.

Planning goes through `batchgen.job.run.planned_job` like a Parquet job: each request file's
`ShardInfo` carries its identity (size, request count as rows, sha256 of the whole file as the
footer hash), recorded in the manifest's `ShardRecord.input`. The response file sits next to
the request file (``run-batch``), so the output folder may hold the inputs; what is refused is
an output file that would be a request file (`check_output_files_not_inputs`), and
``--restart`` never deletes an input file.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchgen.io import (
    InputError,
    InputIdentity,
    OutputRow,
    ShardInfo,
    ShardRecord,
    file_key,
    find_input_shards,
)
from batchgen.io.jsonl_writer import JsonlShardWriter, summarize_openai_output
from batchgen.io.openai_batch import CHAT_URL, inspect_openai_batch, iter_openai_batches
from batchgen.job.config import JobConfig
from batchgen.job.stages import JobError, ShardMeta, ShardStats
from batchgen.tokenizer.tokenizer import Tokenizer

__all__ = [
    "OpenAIBatchSink",
    "OpenAIBatchSource",
    "check_output_files_not_inputs",
    "plan_openai_shards",
    "response_line",
]

# Output row passthrough order, fixed by batchgen.io.openai_batch.OPENAI_COLUMNS.
_URL, _MODEL, _LINE = 0, 1, 2


def check_output_files_not_inputs(out_dir: Path, names: Sequence[str], input_paths: Sequence[Path]) -> None:
    """Refuse an output or side file (``out_dir/name``) that is an input file: the same path
    once links are resolved, or the same device and inode (a hard link, a bind mount, another
    case on a case-insensitive file system). Writing it would overwrite the requests, and
    ``--restart`` would delete them. Raises InputError naming both."""
    inputs = {os.path.realpath(p): p for p in input_paths}
    keys = {file_key(p): p for p in input_paths}
    keys.pop(None, None)
    for name in names:
        out = out_dir / name
        same = inputs.get(os.path.realpath(out)) or keys.get(file_key(out))
        if same is not None:
            raise InputError(
                f"output file {out} is the input file {same}: writing it would overwrite the "
                "requests; choose another output file name or folder"
            )


def plan_openai_shards(config: JobConfig) -> list[ShardInfo]:
    """The request files of the job (a file, a folder of ``*.jsonl`` files or a glob), each
    checked and counted. Output shards keep the request file's name (``.parquet`` instead of
    ``.jsonl`` for Parquet output); with `IoConfig.output_name` (``run-batch -o``) the single
    shard takes that name. Raises InputError naming the file."""
    out_dir = config.resolve_path(config.io.output)
    shards = find_input_shards(config.io.input, config.base_dir, exclude=out_dir, suffix=".jsonl")
    name = config.io.output_name
    if name is not None and len(shards) != 1:
        raise InputError(
            f"input '{config.io.input}' names {len(shards)} request files; an output file name "
            "needs exactly one (give an output folder instead)"
        )
    planned = []
    for s in shards:
        out_name = name if name is not None else s.name
        if name is None and config.io.output_format == "parquet":
            out_name = out_name.removesuffix(".jsonl") + ".parquet"
        planned.append(inspect_openai_batch(s.path, name=out_name))
    return planned


class OpenAIBatchSource:
    """Streams the requests of each request file (one shard per file), checking each file
    against the identity recorded at planning (`ShardMeta.identity`) as it is read."""

    def __init__(self, batch_rows: int, max_line_bytes: int) -> None:
        self._batch_rows = batch_rows
        self._max_line_bytes = max_line_bytes

    def iter_batches(self, shard: ShardMeta) -> Iterator[pa.RecordBatch]:
        batches: Iterator[pa.RecordBatch] = iter_openai_batches(
            Path(shard.input_path),
            self._batch_rows,
            max_line_bytes=self._max_line_bytes,
            expected=shard.identity,
        )
        return batches


def _usage(samples: Sequence[OutputRow]) -> dict[str, Any]:
    first = samples[0]
    completion = sum(s.completion_tokens for s in samples)
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }


def _token_texts(tokenizer: Tokenizer, token_ids: Sequence[int]) -> list[str]:
    return [tokenizer.decode([t], skip_special_tokens=False) for t in token_ids]


def _chat_logprobs(tokenizer: Tokenizer, row: OutputRow) -> dict[str, Any] | None:
    if row.logprobs is None or row.output_token_ids is None:
        return None
    texts = _token_texts(tokenizer, row.output_token_ids)
    tops = row.top_logprobs or tuple(() for _ in texts)
    content = []
    for text, lp, top in zip(texts, row.logprobs, tops, strict=True):
        alternatives = [
            {"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))}
            for t, (_, v) in zip(_token_texts(tokenizer, [i for i, _ in top]), top, strict=True)
        ]
        content.append(
            {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")), "top_logprobs": alternatives}
        )
    return {"content": content, "refusal": None}


def _top_dict(tokenizer: Tokenizer, top: Sequence[tuple[int, float]]) -> dict[str, float]:
    return dict(zip(_token_texts(tokenizer, [i for i, _ in top]), (v for _, v in top), strict=True))


def _completion_logprobs(tokenizer: Tokenizer, row: OutputRow) -> dict[str, Any] | None:
    """OpenAI's completions ``logprobs``: tokens, their logprobs, top ones and text offsets; an
    echoed prompt's tokens come first."""
    echo = row.echo if row.echo is not None and row.echo.logprobs is not None else None
    has_output = row.logprobs is not None and row.output_token_ids is not None
    if not has_output and echo is None:
        return None
    token_ids: list[int] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    has_top = row.top_logprobs is not None or (echo is not None and echo.top_logprobs is not None)
    if echo is not None and echo.logprobs is not None:
        token_ids += echo.token_ids
        values += echo.logprobs
        tops += [None if t is None else _top_dict(tokenizer, t) for t in echo.top_logprobs or [None] * len(echo.logprobs)]
    if has_output and row.logprobs is not None and row.output_token_ids is not None:
        token_ids += row.output_token_ids
        values += row.logprobs
        tops += [_top_dict(tokenizer, t) for t in row.top_logprobs or [()] * len(row.logprobs)]
    texts = _token_texts(tokenizer, token_ids)
    offsets, offset = [], 0
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": texts,
        "token_logprobs": values,
        "top_logprobs": tops if has_top else None,
        "text_offset": offsets,
    }


def response_line(
    samples: Sequence[OutputRow], *, tokenizer: Tokenizer, served_model: str, created: int
) -> dict[str, Any]:
    """The response line of one request from its output rows (one per sample, in order)."""
    first = samples[0]
    url, model, line = first.passthrough[_URL], first.passthrough[_MODEL], first.passthrough[_LINE]
    head = {"id": f"batch_req_{line}", "custom_id": first.id}
    request_id = f"req_{line}"
    if first.error_code is not None:
        message = first.error_message or ""
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": first.error_code,
            }
        }
        return {
            **head,
            "response": {"status_code": 400, "request_id": request_id, "body": body},
            "error": {"code": first.error_code, "message": message},
        }
    is_chat = url == CHAT_URL
    choices: list[dict[str, Any]] = []
    for s in samples:
        if is_chat:
            choices.append(
                {
                    "index": s.sample_index,
                    "message": {"role": "assistant", "content": s.output, "refusal": None},
                    "logprobs": _chat_logprobs(tokenizer, s),
                    "finish_reason": s.finish_reason,
                }
            )
        else:
            choices.append(
                {
                    "index": s.sample_index,
                    "text": s.output if s.echo is None else s.echo.text + (s.output or ""),
                    "logprobs": _completion_logprobs(tokenizer, s),
                    "finish_reason": s.finish_reason,
                }
            )
    completion: dict[str, Any] = {
        "id": f"{'chatcmpl' if is_chat else 'cmpl'}-batchgen-{line}",
        "object": "chat.completion" if is_chat else "text_completion",
        "created": created,
        "model": model if model is not None else served_model,
        "choices": choices,
        "usage": _usage(samples),
        "system_fingerprint": None,
    }
    return {
        **head,
        "response": {"status_code": 200, "request_id": request_id, "body": completion},
        "error": None,
    }


def _requests(rows: Sequence[OutputRow]) -> Iterator[list[OutputRow]]:
    """Split rows (in input order) into requests: each request's samples start at index 0."""
    group: list[OutputRow] = []
    for row in rows:
        if row.sample_index == 0 and group:
            yield group
            group = []
        group.append(row)
    if group:
        yield group


class OpenAIBatchSink:
    """Writes each shard as a response file; each committed shard's record (with its request
    file's identity, `identities[shard name]`) goes to `on_commit`, as with `FileSink`. A
    response file carries no metadata, so its request file's identity goes to `on_pending`
    before the file is renamed into place (what a resume checks a file it finds unrecorded
    against)."""

    def __init__(
        self,
        out_dir: Path,
        tokenizer: Tokenizer,
        served_model: str,
        identities: Mapping[str, InputIdentity],
        on_commit: Callable[[str, ShardRecord], None],
        on_pending: Callable[[str, InputIdentity], None],
    ) -> None:
        self._out_dir = out_dir
        self._on_pending = on_pending
        self._tokenizer = tokenizer
        self._served_model = served_model
        self._identities = identities
        self._on_commit = on_commit
        self._writers: dict[int, JsonlShardWriter] = {}

    def _writer(self, shard: ShardMeta) -> JsonlShardWriter:
        writer = self._writers.get(shard.index)
        if writer is None:
            writer = self._writers[shard.index] = JsonlShardWriter(self._out_dir, shard.name)
        return writer

    def write(self, shard: ShardMeta, rows: Sequence[OutputRow]) -> None:
        created = int(time.time())
        lines = [
            response_line(
                group, tokenizer=self._tokenizer, served_model=self._served_model, created=created
            )
            for group in _requests(rows)
        ]
        try:
            self._writer(shard).write(lines)
        except OSError as exc:
            raise JobError(f"{self._out_dir / shard.name}: cannot write the response file: {exc}") from exc

    def commit(self, shard: ShardMeta, stats: ShardStats) -> None:
        try:
            self._on_pending(shard.name, self._identities[shard.name])
            path = self._writer(shard).commit()
            del self._writers[shard.index]
            record = summarize_openai_output(path, input=self._identities[shard.name])
        except OSError as exc:
            raise JobError(f"{self._out_dir / shard.name}: cannot commit the response file: {exc}") from exc
        self._on_commit(
            shard.name,
            dataclasses.replace(record, wall_s=round(time.perf_counter() - stats.started, 3)),
        )

    def discard(self, shard: ShardMeta) -> None:
        writer = self._writers.pop(shard.index, None)
        if writer is not None:
            writer.abort()

    def abort(self) -> None:
        for writer in self._writers.values():
            writer.abort()
        self._writers.clear()
