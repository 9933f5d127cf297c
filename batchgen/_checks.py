"""Value checks shared by the frozen configs of every layer (engine, models, job)."""

from __future__ import annotations

__all__ = ["check_int", "is_int"]


def is_int(value: object) -> bool:
    """True for a Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(where: str, value: object, *, minimum: int) -> None:
    """Raise ValueError naming `where` unless `value` is an int (not a bool) >= minimum."""
    if not is_int(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{where}: expected an integer >= {minimum}, got {value!r}")
