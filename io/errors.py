"""The one exception `batchgen.io` raises for bad input, output folders and manifests.

Owns: `InputError`. Its message is meant for users as it is (the CLI prints ``str(exc)`` without
a traceback), so every raise names the file or folder, the column or key, and what was expected.

May import: the standard library only.
"""

from __future__ import annotations

__all__ = ["InputChangedError", "InputError", "ShardReadError"]


class InputError(Exception):
    """A problem with the job's input shards, output folder or manifest, worded for users."""


class ShardReadError(InputError):
    """An input shard that cannot be read (unreadable footer, corrupt row group): the job
    may skip it (``on_bad_shard: skip``), unlike a schema or configuration problem."""


class InputChangedError(InputError):
    """An input shard whose identity, taken from the open file when its reading starts (or
    ends, for a request file hashed while read), differs from the one recorded when the job
    was planned: the file was replaced or edited meanwhile. Never skipped: the job stops, and a
    new run plans with the new file."""
