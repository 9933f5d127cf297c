"""The identity of an input shard, recorded so that a resume can tell it is the same data.

Owns: `InputIdentity` (path, size, row count, footer hash) and its JSON form.

May import: the standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["InputIdentity"]


@dataclass(frozen=True, slots=True)
class InputIdentity:
    """What identifies an input shard: its path, size in bytes, row count and footer sha256.
    Two identities `matches` when the contents agree (size, rows, footer); the path is kept
    for messages, so a moved input folder still resumes."""

    path: str
    size: int
    num_rows: int
    footer_hash: str

    def matches(self, other: InputIdentity) -> bool:
        return (self.size, self.num_rows, self.footer_hash) == (
            other.size,
            other.num_rows,
            other.footer_hash,
        )

    def describe(self) -> str:
        return f"{self.size} bytes, {self.num_rows} rows, footer {self.footer_hash[:12]}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> InputIdentity:
        """Raises ValueError on a missing or mistyped field."""
        if not isinstance(data, dict) or set(data) != {"path", "size", "num_rows", "footer_hash"}:
            raise ValueError(f"input identity: expected path, size, num_rows, footer_hash, got {data!r}")
        for name in ("size", "num_rows"):
            if not isinstance(data[name], int) or isinstance(data[name], bool):
                raise ValueError(f"input identity {name!r}: expected an integer, got {data[name]!r}")
        for name in ("path", "footer_hash"):
            if not isinstance(data[name], str):
                raise ValueError(f"input identity {name!r}: expected a string, got {data[name]!r}")
        return cls(data["path"], data["size"], data["num_rows"], data["footer_hash"])
