"""Checks of a report page shared by the report and bench tests (no tests in here)."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

__all__ = ["PNG_MAGIC", "assert_self_contained", "images", "section_tables"]

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


class _Tables(HTMLParser):
    """Every table's rows (header row included) as cell texts, grouped by the `<h2>` above."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, list[list[list[str]]]] = {}
        self._heading: str | None = None
        self._in_h2 = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h2":
            self._in_h2, self._heading = True, ""
        elif tag == "table" and self._heading is not None:
            self.sections.setdefault(self._heading, []).append([])
        elif tag == "tr" and self._heading is not None:
            self.sections[self._heading][-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._in_h2 = False
        elif tag in ("td", "th") and self._cell is not None and self._heading is not None:
            self.sections[self._heading][-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._in_h2:
            self._heading = (self._heading or "") + data
        elif self._cell is not None:
            self._cell.append(data)


def section_tables(page: str, heading: str) -> list[list[list[str]]]:
    """The tables under the `<h2>heading</h2>` of `page`: each a list of rows of cell texts
    (entities decoded), the header row first."""
    parser = _Tables()
    parser.feed(page)
    parser.close()
    return parser.sections.get(heading, [])
