"""Resume and restart: open (or reset) the manifest of an output folder and decide, shard by
shard, what a run skips, adopts, regenerates or refuses.

Invariants (the caller holds the output folder's lock for all of it):
- A run resumes only outputs made from the same input data under the same configuration: the
  manifest's fingerprint, each committed record's input identity, and each output file's own
  metadata (fingerprint digest and input identity) must all match; otherwise
  `ConfigChangedError` names the shard or the changed keys, before anything is deleted.
- A committed shard's output file that is gone is generated again; an output file renamed into
  place by a run killed before its manifest save is adopted when its metadata matches.
- ``--restart`` deletes only regular files inside the output folder that batchgen wrote: every
  shard the old manifest lists as committed (its names validated as plain file names when
  loaded), and every output named after an input shard or (for a folder of shards) any Parquet
  file there whose contents say it is ours (a Parquet file with our metadata, or a response
  file whose first line is a response line).
  It works when the old manifest is unreadable. It never deletes through a symbolic link, never
  an input file (a request file next to its response file, ``run-batch``), and a file that is
  not ours under a name this run will write stops the restart before anything is deleted (the
  run would overwrite it); other files of other origin are left alone.
- OpenAI batch response files (JSONL) carry no metadata: their manifest record's input identity
  is checked, and one renamed into place by a killed run is adopted as it is.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgen.io import (
    BadShard,
    InputError,
    InputIdentity,
    JobFolder,
    Manifest,
    ShardInfo,
    file_key,
    fingerprint_digest,
    fsync_path,
    read_shard_metadata,
    summarize_output_shard,
)
from batchgen.io.jsonl_writer import summarize_openai_output
from batchgen.job.stages import JobError

__all__ = ["ConfigChangedError", "ResumePlan", "bad_shard", "open_manifest", "plan_resume"]

_RESTART_HINT = "run with --restart to discard the existing outputs, or use another output folder"


class ConfigChangedError(JobError):
    """The output folder belongs to another configuration or other input data (resume
    refused)."""


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """What this run does: generate `todo`; `skipped` are committed already; `known_bad` are
    input shards a previous run found unreadable and that have not changed (name -> error)."""

    todo: list[ShardInfo]
    skipped: list[str]
    known_bad: dict[str, str]


def open_manifest(
    folder: JobFolder,
    fingerprint: Mapping[str, Any],
    input_names: Sequence[str],
    *,
    restart: bool,
    job_time: str,
    inputs: Sequence[Path] = (),
) -> Manifest:
    """The manifest this run continues, or a new one (`job_time` recorded) after clearing the
    folder for ``--restart`` (never deleting one of the job's `inputs`). Raises ConfigChangedError when the stored fingerprint differs or
    outputs exist without a manifest, InputError for an unreadable manifest (without restart)
    or, with restart, a file that is not batchgen's under a name this run writes."""
    out_dir, name = folder.path, folder.manifest_name
    if restart:
        _clear_outputs(folder, input_names, inputs)
        return Manifest.create(out_dir, fingerprint, job_time=job_time, name=name)
    manifest = Manifest.load(out_dir, name=name)
    if manifest is None:
        existing = [n for n in input_names if os.path.lexists(out_dir / n)]
        if existing:
            raise ConfigChangedError(
                f"{out_dir} already holds {', '.join(existing[:3])} but no {name}; "
                "run with --restart to overwrite it if batchgen wrote it, or use another output folder"
            )
        return Manifest.create(out_dir, fingerprint, job_time=job_time, name=name)
    changes = manifest.diff_fingerprint(fingerprint)
    if changes:
        raise ConfigChangedError(
            f"{manifest.path} was written by a different configuration:\n  "
            + "\n  ".join(changes)
            + "\n"
            + _RESTART_HINT
        )
    return manifest


def _is_regular_file(path: Path) -> bool:
    """A regular file itself (not through a link; not a FIFO, device or folder)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _is_batchgen_output(path: Path) -> bool:
    """Whether the regular file `path` is an output batchgen wrote: a Parquet file carrying
    our metadata, or a response file whose first line has a response line's keys."""
    if path.name.endswith(".jsonl"):
        try:
            with path.open("rb") as handle:
                first = json.loads(handle.readline(1 << 20) or b"null")
        except (OSError, ValueError):
            return False
        return (
            isinstance(first, dict)
            and set(first) == {"id", "custom_id", "response", "error"}
            and str(first.get("id", "")).startswith("batch_req_")
        )
    try:
        return read_shard_metadata(path) is not None
    except InputError:
        return False


def _clear_outputs(folder: JobFolder, input_names: Sequence[str], inputs: Sequence[Path]) -> None:
    """Delete what ``--restart`` discards (module docstring); refuse, before deleting anything,
    a file that is not batchgen's under a name in `input_names` (this run would overwrite it)."""
    out_dir = folder.path
    names = set(input_names)
    keep = {file_key(p) for p in inputs}
    try:
        old = Manifest.load(out_dir, name=folder.manifest_name)
    except InputError:
        old = None  # unreadable: restart discards it; the folder scan below finds our files
    listed: set[str] = set()
    if old is not None:
        listed = set(old.committed())
        names |= listed | set(old.bad_shards())
    if not folder.prefix:  # a folder of shards is the job's own: find our files by content
        for path in out_dir.glob("*.parquet"):
            if (
                not path.name.startswith(".")
                and path.name not in names
                and _is_regular_file(path)  # before opening it: a FIFO would block the open
                and _is_batchgen_output(path)
            ):
                names.add(path.name)
    doomed: list[Path] = []
    for name in sorted(names):
        path = out_dir / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if file_key(path) in keep:
            continue  # an input file is never an output to discard
        # ours: a regular file the old manifest records as committed (maybe an older
        # version's, without metadata), or one whose contents say batchgen wrote it
        is_ours = stat.S_ISREG(info.st_mode) and (name in listed or _is_batchgen_output(path))
        if is_ours:
            doomed.append(path)
        elif name in input_names:
            raise InputError(
                f"{path} is not an output batchgen wrote ({'a symbolic link' if stat.S_ISLNK(info.st_mode) else 'other contents'}), "
                "and this run would write an output under its name; move it away or use "
                "another output folder (--restart deletes only batchgen's own files)"
            )
    for path in doomed:
        path.unlink(missing_ok=True)
    fsync_path(out_dir)


def _input_changed(name: str, old: InputIdentity, new: InputIdentity) -> str:
    return (
        f"output shard {name} was made from another input: {old.path} ({old.describe()}) "
        f"then, {new.path} ({new.describe()}) now; {_RESTART_HINT}"
    )


def plan_resume(
    out_dir: Path,
    manifest: Manifest,
    fingerprint: Mapping[str, Any],
    infos: Sequence[ShardInfo],
    unreadable: Sequence[str],
    *,
    jsonl_outputs: bool = False,
) -> ResumePlan:
    """Check every committed or present output against today's inputs (`infos`, plus the
    names of inputs whose footer is unreadable) and plan the run; adopts (and records) a whole
    output file a killed run renamed into place. `jsonl_outputs`: the outputs are OpenAI batch
    response files, which carry no metadata to check. Raises ConfigChangedError naming the
    shard."""
    done = manifest.committed()
    known_bad = manifest.bad_shards()
    current = {info.name for info in infos} | set(unreadable)
    stale = sorted(name for name in done if name not in current)
    if stale:
        raise ConfigChangedError(
            f"{manifest.path} lists committed shard(s) {', '.join(stale[:3])} whose input "
            f"({done[stale[0]].input_path}) is not among this job's inputs; {_RESTART_HINT}"
        )
    digest = fingerprint_digest(fingerprint)
    todo: list[ShardInfo] = []
    skipped: list[str] = []
    bad: dict[str, str] = {}
    for info in infos:
        identity = info.identity()
        record = done.get(info.name)
        if record is not None and not record.input.matches(identity):
            raise ConfigChangedError(_input_changed(info.name, record.input, identity))
        out = out_dir / info.name
        if out.is_symlink():
            raise ConfigChangedError(
                f"{out} is a symbolic link; batchgen writes its outputs as regular files and "
                "never through a link: remove it or use another output folder"
            )
        if out.is_file():
            if not jsonl_outputs:
                _check_output_file(out, digest, identity)
            elif record is None:
                _check_pending(manifest, out, identity)
            if record is None:
                # Killed after the rename, before the manifest save: the file is whole.
                summarize = summarize_openai_output if jsonl_outputs else summarize_output_shard
                manifest.mark_committed(info.name, summarize(out, input=identity))
            skipped.append(info.name)
            continue
        old_bad = known_bad.get(info.name)
        if old_bad is not None and old_bad.input.matches(identity):
            bad[info.name] = old_bad.error
            continue
        todo.append(info)
    return ResumePlan(todo=todo, skipped=skipped, known_bad=bad)


def _check_pending(manifest: Manifest, out: Path, identity: InputIdentity) -> None:
    """A response file the manifest does not list (renamed by a run killed before its record)
    is adopted only when the identity recorded just before its rename is today's input's."""
    pending = manifest.pending().get(out.name)
    if pending is None:
        raise ConfigChangedError(
            f"{out} is not recorded in {manifest.path}: batchgen cannot tell which requests it "
            f"answers; {_RESTART_HINT}"
        )
    if not pending.matches(identity):
        raise ConfigChangedError(_input_changed(out.name, pending, identity))


def _check_output_file(out: Path, digest: str, identity: InputIdentity) -> None:
    metadata = read_shard_metadata(out)
    if metadata is None:
        raise ConfigChangedError(
            f"{out} was not written by batchgen (it has no batchgen metadata); move it away or "
            "use another output folder (--restart deletes only batchgen's own files)"
        )
    out_digest, out_identity = metadata
    if not out_identity.matches(identity):
        raise ConfigChangedError(_input_changed(out.name, out_identity, identity))
    if out_digest != digest:
        raise ConfigChangedError(
            f"output shard {out.name} was written under another configuration (its metadata "
            f"holds fingerprint {out_digest[:12]}, this job's is {digest[:12]}); {_RESTART_HINT}"
        )


def bad_shard(info_or_path: ShardInfo | Path, error: str) -> BadShard:
    """The manifest record of an input shard skipped as unreadable; a shard whose footer
    could not be read has no row count or footer hash (0 and "")."""
    if isinstance(info_or_path, ShardInfo):
        return BadShard(info_or_path.identity(), error)
    path = info_or_path
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    return BadShard(InputIdentity(str(path), size, 0, ""), error)
