"""Checks of a report page shared by the report and bench tests (no tests in here)."""

from __future__ import annotations

import base64
import re

__all__ = ["PNG_MAGIC", "assert_self_contained", "images"]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def assert_self_contained(page: str) -> None:
    """One file: no script, no stylesheet or image fetched from anywhere, every image inline."""
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", page), "an external resource"
    assert "http://" not in page and "https://" not in page
    assert all(img.startswith(PNG_MAGIC) for img in images(page))
