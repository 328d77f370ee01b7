"""The comparison as a text table and as a PNG: one panel per figure, one bar per
experiment, labelled by the params that differ; or, along a numeric param, the acceptance
figures as curves against it and against the CPU-hours each draft cost."""

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


# the acceptance figures a scaling plot draws, where the experiments have them
CURVES = ("MT-Bench", "HumanEval", "MT-Bench T>0", "acceptance length")


def series(rows: list[Any], param: str, params: list[str]) -> dict[str, list[Any]]:
    """The rows as curves along ``param``: one per combination of the other params that
    differ (a sweep's points share them; an experiment that also changed the learning rate
    is another curve, not a point on this one). Keys are the curves' labels ("" alone)."""
    out: dict[str, list[Any]] = {}
    others = [p for p in params if p != param]
    for r in rows:
        key = ", ".join(f"{p}={_fmt(r.params.get(p))}" for p in others)
        out.setdefault(key, []).append(r)
    return out


LABEL_CHARS = 60  # a curve named by more params than this is named by its experiments


def curve_label(key: str, members: list[Any]) -> str:
    """A curve's legend: the other params' values where they are short, else the names of
    its experiments (a curve that differs from the sweep in a whole model config would
    otherwise draw a legend wider than the figure)."""
    if len(key) <= LABEL_CHARS:
        return key
    names = ", ".join(r.name for r in members)
    return names if len(names) <= LABEL_CHARS else names[: LABEL_CHARS - 3] + "..."


def _readable_log_ticks(ax: Any, at_points: bool) -> None:
    """A log axis without matplotlib's minor labels (they overlap: "3x10^2 4x10^2"); along
    the swept param, the ticks are the swept values themselves (64, 250, 1000)."""
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())
    xs = sorted({float(x) for line in ax.get_lines() for x in line.get_xdata()})
    if at_points and len(xs) <= 8:
        ax.set_xticks(xs, [_fmt(int(x) if x.is_integer() else x) for x in xs])


def render_scaling(rows: list[Any], param: str, params: list[str], out: Path) -> None:
    """Acceptance against ``param`` (log scale: sample counts grow by factors) and against
    CPU-hours, and vLLM's single-stream speedup against ``param``; one point per experiment,
    one curve per combination of the other ``params`` that differ (:func:`series`). Benchmarks' figures replace the held-out acceptance where
    they exist (the held-out prompts come from the training data's distribution)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [c for c in CURVES[:3] if any(r.figures.get(c) is not None for r in rows)]
    curves = curves or ["acceptance length"]
    curves_of = series(rows, param, params)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), squeeze=False)
    panels = (
        (axes[0][0], lambda r: r.params.get(param), param, curves, "acceptance length"),
        (
            axes[0][1],
            lambda r: r.figures.get("CPU-hours"),
            "CPU-hours to the draft",
            curves,
            "acceptance length",
        ),
        (
            axes[0][2],
            lambda r: r.params.get(param),
            param,
            ["vLLM speedup"],
            "single-stream speedup (x)",
        ),
    )
    for ax, x_of, xlabel, names, ylabel in panels:
        drawn = False
        for name in names:
            for key, members in curves_of.items():
                pts = [
                    (float(x), float(y), r.name)
                    for r in members
                    if (x := x_of(r)) is not None and (y := r.figures.get(name)) is not None
                ]
                if not pts:
                    continue
                pts.sort()
                label = f"{name} ({curve_label(key, members)})" if key else name
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
                for x, y, _ in pts:
                    ax.annotate(
                        _fmt(y), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7
                    )
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        elif all(x > 0 for line in ax.get_lines() for x in line.get_xdata()):
            ax.set_xscale("log")
            _readable_log_ticks(ax, xlabel == param)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if drawn and (len(names) > 1 or len(curves_of) > 1):
            ax.legend(fontsize=7)
    fig.suptitle(f"acceptance against {param} ({len(rows)} experiments)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())
