"""The report's serving section: acceptance at temperature > 0, the speedup per number of
requests in flight (a table and ``speedup_by_concurrency.png``) and the K sweep.

Every figure here is vLLM's own (its counters and its clock); the section says under
which temperature, K, concurrency and precision each was measured (the precision a user
serves the target in: validate/engines.py).
"""

from __future__ import annotations

import io
from typing import Any

from eagle3_pipeline.validate.record import ConcurrencyFigures, SampledFigures, VllmFigures


def fmt(value: Any, digits: int = 3) -> str:
    """A figure as the report prints it: n/a for none, floats to ``digits`` places."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def in_dtype(dtype: str | None) -> str:
    """The precision a figure was measured in (", in bfloat16"), where the record names it."""
    return f", in {dtype}" if dtype else ""


def _in_flight(concurrency: int | None) -> str:
    """How many requests a counting pass had in flight (a record without it: one)."""
    c = concurrency or 1
    if c == 1:
        return "one request at a time"
    return f"{c} requests in flight, one prompt set, category and turn at a time"


def sampled_lines(
    s: SampledFigures, k: int, max_new_tokens: int, dtype: str | None = None
) -> list[str]:
    lines = [
        f"Acceptance length at temperature {s.temperature} (seed {s.seed}: prompt i "
        f"sampled with seed + i; K={k}, {_in_flight(s.concurrency)}, at most {max_new_tokens} new "
        f"tokens{in_dtype(dtype)}): vLLM's rejection sampler decides what is accepted. From "
        "vLLM's counters "
        f"(1 + accepted/drafts): **{fmt(s.mean_acceptance_length)}** pooled "
        f"({s.num_accepted_tokens} accepted / {s.num_drafts} drafts).",
        "",
        "| prompt set | T=" + str(s.temperature) + " | per position (rate of drafts) |",
        "|---|---:|---|",
    ]
    for name, f in s.sets.items():
        rates = " / ".join(fmt(r) for r in f.per_position_rate)
        lines.append(f"| {name} | **{fmt(f.mean_acceptance_length)}** | {rates} |")
    return lines


def concurrency_lines(
    c: ConcurrencyFigures,
    k: int,
    dtype: str | None = None,
    over: str = "every prompt decoded above",
) -> list[str]:
    b = c.break_even_concurrency
    top = max(r.concurrency for r in c.levels)
    lines = [
        f"Output tokens/s in vLLM with and without the draft, K={k}, temperature "
        f"0{in_dtype(dtype)}, with N requests in flight (a new one starts as one finishes) over "
        f"{over}:",
        "",
        "| requests in flight | without the draft (tokens/s) | with it (tokens/s) | speedup "
        "| acceptance length | same outputs |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in c.levels:
        lines.append(
            f"| {r.concurrency} | {fmt(r.tokens_per_s_without_draft, 1)} | "
            f"{fmt(r.tokens_per_s_with_draft, 1)} | **{fmt(r.speedup, 2)}x** | "
            f"{fmt(r.acceptance_length)} | {fmt(r.same_outputs)} |"
        )
    lines += [
        "",
        (
            f"The draft stops paying at concurrency **{b}** (the lowest number of requests in "
            "flight measured where its speedup is below 1)."
            if b
            else f"The draft pays at every level measured (up to {top} requests in flight)."
        ),
    ]
    if c.skipped:
        lines.append(
            f"Not measured: {c.skipped} (fewer prompts than requests in flight; raise "
            "validate.num_prompts)."
        )
    lines += ["", "![speedup per concurrency](speedup_by_concurrency.png)"]
    return lines


def k_sweep_lines(v: VllmFigures) -> list[str]:
    lines = [
        f"The same draft served at each K (temperature 0, one request at a time"
        f"{in_dtype(v.speed_dtype())}); the "
        f"recommended K is the one vLLM delivers most tokens/s with: **K={v.best_k}** "
        f"({fmt(v.best_k_speedup, 2)}x), not the one with the longest acceptance.",
        "",
        "| K | acceptance length | tokens/s | speedup | lossless |",
        "|---:|---:|---:|---:|---|",
    ]
    for r in v.k_sweep or []:
        lines.append(
            f"| {r.k} | {fmt(r.acceptance_length)} | {fmt(r.tokens_per_s, 1)} | "
            f"{fmt(r.speedup, 2)}x | {fmt(r.lossless)} |"
        )
    return lines


def serving_lines(v: VllmFigures, k: int, max_new_tokens: int) -> list[str]:
    """The report's sections for what vLLM measured beyond the greedy single stream."""
    lines: list[str] = []
    if v.sampled:
        lines += [
            "",
            "## Sampled (temperature > 0)",
            "",
            *sampled_lines(v.sampled, k, max_new_tokens, v.speed_dtype()),
        ]
    if v.concurrency and v.concurrency.levels:
        over = (
            f"{v.speed_prompts} of the {v.prompts} prompts decoded above, evenly spaced "
            "(validate.speed_prompts)"
            if v.speed_prompts is not None and v.speed_prompts != v.prompts
            else "every prompt decoded above"
        )
        lines += [
            "",
            "## Under load",
            "",
            *concurrency_lines(v.concurrency, k, v.speed_dtype(), over),
        ]
    if v.k_sweep:
        lines += ["", "## K", "", *k_sweep_lines(v)]
    return lines


def concurrency_png(c: ConcurrencyFigures, title: str) -> bytes:
    """Speedup per number of requests in flight (log2 axis), with the break-even line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in c.levels if r.speedup is not None]
    xs = [r.concurrency for r in rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax.plot(xs, [r.speedup for r in rows], marker="o", label="with / without the draft")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="break-even")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("speedup (output tokens/s)")
    ax.legend(fontsize=8)
    ax2.plot(xs, [r.tokens_per_s_without_draft for r in rows], marker="o", label="target alone")
    ax2.plot(xs, [r.tokens_per_s_with_draft for r in rows], marker="o", label="with the draft")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(xs, [str(x) for x in xs])
    ax2.set_xlabel("requests in flight")
    ax2.set_ylabel("output tokens/s")
    ax2.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
