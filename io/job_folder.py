"""Where a job's files live: its output folder, and the names of the side files batchgen keeps
beside the output shards.

Owns: `JobFolder` -- the folder, the names of its side files (manifest, summary, timeline, report
and its figures folder, lock) and the rules that keep outputs and side files apart
(`check_output_names`, `is_output_name`).

Invariants:
- A Parquet job's side files have the plain names (``manifest.json``, ``summary.json``,
  ``timeline.parquet``, ``report.html``, ``report_figures/``, ``.batchgen.lock``); a job with one
  named output file (``run-batch -o results.jsonl``) prefixes them with that name
  (``results.jsonl.manifest.json``, ..., ``.results.jsonl.batchgen.lock``), so several batches
  share a folder and a user's own ``summary.json`` there is never touched.
- No output takes a side file's name: a name that is one of the plain side names, or ends with
  ``.`` and one of them (another batch's side file), is refused (`check_output_names`), before
  anything is written.
- An output name is one plain path component (`is_output_name`): no separator, not ``.`` or
  ``..``, not hidden, no side file's name; the manifest is validated with it when loaded, so no
  entry can point outside the folder or at a side file.

May import: the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

__all__ = ["SIDE_FILE_NAMES", "JobFolder", "is_output_name"]

# The side files of a Parquet job's folder; a named output's side files add its name before them.
SIDE_FILE_NAMES = ("manifest.json", "summary.json", "timeline.parquet", "report.html", "report_figures")
_LOCK = "batchgen.lock"


def is_output_name(name: object) -> bool:
    """Whether `name` can be the name of an output file batchgen writes: one plain, visible
    path component that is no side file's name."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        return False
    if any(c in name for c in ("/", "\\", "\0")) or name.startswith("."):
        return False
    return not _is_side_name(name)


def _is_side_name(name: str) -> bool:
    return any(name == side or name.endswith("." + side) for side in SIDE_FILE_NAMES)


@dataclass(frozen=True, slots=True)
class JobFolder:
    """A job's output folder `path`; its side files are named ``{prefix}{plain name}``."""

    path: Path
    prefix: str = ""

    @classmethod
    def for_output_file(cls, output: Path) -> JobFolder:
        """The folder of a job that writes the one file `output`: side files named after it."""
        return cls(output.parent, f"{output.name}.")

    @property
    def manifest_name(self) -> str:
        return f"{self.prefix}manifest.json"

    @property
    def summary(self) -> Path:
        return self.path / f"{self.prefix}summary.json"

    @property
    def timeline_name(self) -> str:
        return f"{self.prefix}timeline.parquet"

    @property
    def report(self) -> Path:
        return self.path / f"{self.prefix}report.html"

    @property
    def figures(self) -> Path:
        return self.path / f"{self.prefix}report_figures"

    @property
    def lock_name(self) -> str:
        return f".{self.prefix}{_LOCK}"

    def side_files(self) -> list[Path]:
        """Every side file's path (the lock included)."""
        names = [f"{self.prefix}{name}" for name in SIDE_FILE_NAMES] + [self.lock_name]
        return [self.path / name for name in names]

    def check_output_names(self, names: Iterable[str], what: str = "output") -> None:
        """Raise InputError naming the first output name that would take a side file's name
        (this job's or another job's in the folder) or is not a plain output name."""
        for name in names:
            if _is_side_name(name):
                raise InputError(
                    f"{what} {self.path / name}: batchgen keeps its own files under this name "
                    f"(reserved: {', '.join(SIDE_FILE_NAMES)} and names ending with '.' and one "
                    "of them); rename the input file or choose another output name"
                )
            if not is_output_name(name):
                raise InputError(f"{what} name {name!r} is not a plain, visible file name")
