"""One self-contained HTML page: inline CSS, figures as base64 PNG data URIs, no script, no
network. Every value put in the page goes through `html.escape`.

May import: the standard library.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Page", "fmt", "kv_table", "pre_json", "table"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;
max-width:1080px;padding:0 16px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dee4;
padding-bottom:4px}.muted{color:#59636e}table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #d8dee4;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:10px 0 18px}figure img{max-width:100%;height:auto;border:1px solid #eef1f4}
figcaption{font-size:12px;color:#59636e}pre{background:#f6f8fa;padding:8px;overflow-x:auto;
font-size:12px;max-height:420px}.note{background:#fff8c5;border:1px solid #d4a72c66;padding:6px 10px}
"""


def fmt(value: Any) -> str:
    """A cell's text: thousands separators for ints, 3 significant decimals for floats."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """An HTML table; numbers right-aligned."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{html.escape(fmt(v))}</td>' if _is_num(v) else f"<td>{html.escape(fmt(v))}</td>"
            for v in row
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def kv_table(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of names and values."""
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(fmt(v))}</td></tr>" for k, v in pairs
    )
    return f"<table><tbody>{rows}</tbody></table>"


def pre_json(value: Any) -> str:
    return f"<pre>{html.escape(json.dumps(value, indent=2, sort_keys=True, default=str))}</pre>"


class Page:
    """Sections appended in order, rendered once by `html()`."""

    def __init__(self, title: str, subtitle: str) -> None:
        self._title = title
        self._parts = [f"<h1>{html.escape(title)}</h1>", f'<p class="muted">{html.escape(subtitle)}</p>']

    def section(self, heading: str, *body: str) -> None:
        """Append a section; `body` is HTML already escaped by this module's helpers."""
        self._parts.append(f"<h2>{html.escape(heading)}</h2>")
        self._parts.extend(body)

    @staticmethod
    def text(text: str, *, note: bool = False) -> str:
        cls = ' class="note"' if note else ""
        return f"<p{cls}>{html.escape(text)}</p>"

    @staticmethod
    def figure(png: bytes, caption: str) -> str:
        data = base64.b64encode(png).decode("ascii")
        alt = html.escape(caption)
        return f'<figure><img src="data:image/png;base64,{data}" alt="{alt}"><figcaption>{alt}</figcaption></figure>'

    def html(self) -> str:
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(self._title)}</title><style>{_CSS}</style></head>"
            f"<body>{''.join(self._parts)}</body></html>\n"
        )
