"""Why one input row failed: an error code and a message, carried into its output row.

Imports nothing of ours.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RowError"]


@dataclass(frozen=True, slots=True)
class RowError:
    code: str
    message: str
