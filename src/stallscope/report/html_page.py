"""The pieces every HTML report is made of: the style sheet, an embedded PNG, a table. Plain HTML,
no imports from the parts that measure, so any renderer can use them."""

from __future__ import annotations

import base64
import html

STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}td:first-child{text-align:left}"
         ".hot{color:#d62728;font-weight:bold}.slowest{font-weight:bold}pre{background:#f6f6f6;padding:.5em}")


def img_tag(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def table_html(header: list[str], rows: list[list[str]]) -> str:
    """A table of already-escaped cells under an escaped header."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
