"""matplotlib for the reports: the Agg backend (no display needed) and a figure's bytes as PNG or PDF.

Its own module, free of analysis imports, so that renderers of plain data (the sweep report) use
matplotlib without reaching the code that measured it.
"""

from __future__ import annotations

import io

from stallscope.extras import needs_extra


def pyplot():
    """matplotlib.pyplot on the Agg backend; the `report` extra's one line where matplotlib is missing."""
    with needs_extra("report", "plots"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_bytes(fig, fmt: str = "png", *, close: bool = True) -> bytes:
    """The figure as `fmt` (png at 100 dpi, or pdf: vector, for a paper), cropped to what it draws."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=100, bbox_inches="tight")
    if close:
        pyplot().close(fig)
    return buffer.getvalue()
