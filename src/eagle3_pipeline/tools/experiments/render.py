"""The comparison as a text table and as a PNG (one panel per figure, one bar per
experiment, labelled by the params that differ)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_pipeline.core.io import atomic_write_bytes


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def label(row: Any, params: list[str]) -> str:
    changed = ", ".join(f"{p}={_fmt(row.params.get(p))}" for p in params)
    return f"{row.name} ({changed})" if changed else row.name


def render_table(rows: list[Any], params: list[str], figures: list[str]) -> str:
    header = ["experiment", *params, *figures]
    body = [
        [
            r.name,
            *(_fmt(r.params.get(p)) for p in params),
            *(_fmt(r.figures.get(f)) for f in figures),
        ]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
    lines = [
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
        for line in (header, *body)
    ]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def render_png(rows: list[Any], params: list[str], figures: list[str], out: Path) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label(r, params) for r in rows]
    fig, axes = plt.subplots(
        1,
        len(figures),
        figsize=(5 * len(figures), 0.5 * len(rows) + 1.8),
        sharey=True,
        squeeze=False,
    )
    for ax, name in zip(axes[0], figures, strict=True):
        values = [r.figures.get(name) for r in rows]
        ax.barh(range(len(rows)), [v or 0.0 for v in values], color="tab:blue")
        for i, v in enumerate(values):
            ax.text(v or 0.0, i, f" {_fmt(v)}", va="center", fontsize=8)
        ax.set_title(name)
        ax.set_yticks(range(len(rows)), labels, fontsize=8)
        ax.invert_yaxis()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())
