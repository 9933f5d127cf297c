"""Writing OpenAI batch response files (JSON lines) atomically, and summarizing them.

Owns: the temporary file of each response file in progress (`JsonlShardWriter`) and the
record of a committed one (`summarize_openai_output`).

Invariants: a response file exists under its final name whole or not at all (temporary file
``.{name}.tmp-*``, fsync, rename, fsync of the folder), exactly like a Parquet output shard,
so `clean_temp_files` finds what a killed run left.

May import: the standard library. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from .errors import InputError
from .identity import InputIdentity
from .manifest import ShardRecord
from .openai_batch import non_blank_lines
from .writer import fsync_path, new_temp_path

__all__ = ["JsonlShardWriter", "summarize_openai_output"]


class JsonlShardWriter:
    """One response file being written: lines go to a temporary file until `commit`, which
    fsyncs it, renames it to ``out_dir/name`` and fsyncs the folder. Leaving the context
    without a commit aborts (the temporary file is removed)."""

    def __init__(self, out_dir: Path, name: str) -> None:
        if not name or Path(name).name != name or name.startswith("."):
            raise ValueError(f"name must be a plain file name, got {name!r}")
        self._final_path = out_dir / name
        self._temp_path = new_temp_path(out_dir, name)
        self._handle: IO[str] | None = self._temp_path.open("x", encoding="utf-8")
        self._num_lines = 0

    @property
    def final_path(self) -> Path:
        return self._final_path

    @property
    def num_lines(self) -> int:
        return self._num_lines

    def write(self, lines: Sequence[Mapping[str, Any]]) -> None:
        """Append one JSON line per mapping. Raises ValueError after commit/abort or for a
        value JSON cannot hold (NaN included)."""
        if self._handle is None:
            raise ValueError(f"response file {self._final_path} is already committed or aborted")
        text = "".join(json.dumps(line, allow_nan=False, ensure_ascii=False) + "\n" for line in lines)
        self._handle.write(text)
        self._num_lines += len(lines)

    def commit(self) -> Path:
        """Make the file final; on failure the temporary file is removed and the error raised."""
        if self._handle is None:
            raise ValueError(f"response file {self._final_path} is already committed or aborted")
        handle, self._handle = self._handle, None
        try:
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            os.replace(self._temp_path, self._final_path)
        except BaseException:
            handle.close()
            self._temp_path.unlink(missing_ok=True)
            raise
        fsync_path(self._final_path.parent)
        return self._final_path

    def abort(self) -> None:
        """Close and delete the temporary file; a no-op after commit or abort."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()
            self._temp_path.unlink(missing_ok=True)

    def __enter__(self) -> JsonlShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()


def summarize_openai_output(path: Path, *, input: InputIdentity) -> ShardRecord:
    """The record of a committed response file made from the request file `input`, from its
    lines' ``error`` and ``response.body.usage`` (streamed). Raises InputError naming the file
    when unreadable."""
    lines = errors = prompt = cached = completion = 0
    codes: Counter[str] = Counter()
    try:
        with path.open("rb") as handle:
            for raw in non_blank_lines(handle):
                lines += 1
                item = json.loads(raw)
                if item.get("error") is not None:
                    errors += 1
                    codes[str(item["error"].get("code") or "unknown")] += 1
                    continue
                usage = item["response"]["body"]["usage"]
                prompt += int(usage["prompt_tokens"])
                completion += int(usage["completion_tokens"])
                cached += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: cannot summarize the response file ({exc})") from exc
    return ShardRecord(
        input_path=input.path,
        input_size=input.size,
        input_footer_hash=input.footer_hash,
        num_input_rows=input.num_rows,
        num_output_rows=lines,
        rows_by_status={"ok": lines - errors, "error": errors},
        error_codes=dict(sorted(codes.items())),
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        wall_s=0.0,
    )
