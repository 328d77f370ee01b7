"""The validate stage's human-readable outputs: a Markdown report, a per-position
acceptance plot (static PNG: ``dvc plots show`` needs a CDN, a PNG opens anywhere) and a
model card (README.md) to publish next to the draft.

Why a model card generated here: the facts a user of a published draft needs (which
target and revision, which layers, what K, what acceptance length measured how, what data
under which licence, which package versions and seeds) are all known to the pipeline at
this point and nowhere else; written by hand they go stale.
"""

from __future__ import annotations

import io
from typing import Any

from eagle3_pipeline.validate.facts import ReportFacts
from eagle3_pipeline.validate.record import SetFigures, SliceFigures, ValidateRecord, VllmFigures
from eagle3_pipeline.validate.report_serving import concurrency_png, in_dtype, serving_lines
from eagle3_pipeline.validate.report_serving import fmt as _fmt

PACKAGES = ("eagle3-pipeline", "speculators", "torch", "transformers", "vllm", "dvc")


def acceptance_png(record: ValidateRecord, title: str) -> bytes:
    """Per-position acceptance rates (and conditional rates) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = record.k
    pos = list(range(1, k + 1))
    rate = [r if r is not None else 0.0 for r in record.ours.per_position_rate]
    cond = [r if r is not None else 0.0 for r in record.ours.per_position_conditional]
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.4
    ax.bar([p - width / 2 for p in pos], rate, width, label="accepted / steps")
    ax.bar([p + width / 2 for p in pos], cond, width, label="accepted / steps reaching position")
    ax.set_xticks(pos)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    _headroom_for_legend(ax)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def sets_png(sets: dict[str, SetFigures], k: int, title: str) -> bytes:
    """Per-position acceptance rate (share of verification steps), one bar group per
    prompt set: vLLM's counters where vLLM ran, else ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(sets)
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        f = sets[name]
        rates = [r if r is not None else 0.0 for r in _rates(f)][:k]
        xs = [i + 1 - 0.4 + width * (j + 0.5) for i in range(len(rates))]
        ax.bar(xs, rates, width, label=f"{name} ({_fmt(f.acceptance())})")
    ax.set_xticks(list(range(1, k + 1)))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / verification steps")
    _headroom_for_legend(ax)
    ax.set_title(title, fontsize=10)
    ax.legend(
        fontsize=8,
        title="prompt set (acceptance length)",
        title_fontsize=8,
        loc="upper center",
        ncol=min(3, max(1, len(names))),
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _headroom_for_legend(ax: Any) -> None:
    """Rates run up to 1, so the y axis goes above it: a legend inside the axes then sits
    over empty space instead of over a good draft's bars."""
    ax.set_ylim(0, 1.3)
    ax.set_yticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])


def _rates(f: SetFigures | SliceFigures) -> list[float | None]:
    """Per-position rates: vLLM's where vLLM ran, else ours."""
    if f.vllm and f.vllm.per_position_rate:
        return list(f.vllm.per_position_rate)
    return f.ours.per_position_rate


def _set_row(label: str, f: SetFigures | SliceFigures) -> str:
    return (
        f"| {label} | {f.ours.prompts} | "
        f"**{_fmt(f.vllm.mean_acceptance_length if f.vllm else None)}** | "
        f"{_fmt(f.ours.vllm_style_acceptance_length)} | "
        f"{_fmt(f.ours.acceptance_length)} | "
        f"{' / '.join(_fmt(r) for r in _rates(f))} |"
    )


def sets_lines(
    sets: dict[str, SetFigures], k: int, max_new_tokens: int, proof_concurrency: int | None = 1
) -> list[str]:
    """The per-set table (and MT-Bench's per-turn and per-category rows)."""
    c = proof_concurrency or 1
    # Our evaluator's figures are per prompt whatever it batches (validate.evaluator), so
    # only vLLM's side names its requests in flight.
    how = (
        "vLLM one request at a time (concurrency 1)"
        if c == 1
        else f"vLLM {c} requests in flight, one prompt set, "
        "category and turn at a time (validate.counting_concurrency)"
    )
    lines = [
        f"Every figure at K={k}, temperature 0 (greedy), {how}, at most {max_new_tokens} new "
        "tokens per prompt. vLLM: 1 + accepted/drafts "
        "from its spec-decode counters; ours: the same definition from our decoder, and "
        "tokens per verification step (end effects included).",
        "",
        "| prompt set | prompts decoded | vLLM | ours (vLLM-style) | ours (per step) | "
        "per position (rate of steps) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, f in sets.items():
        lines.append(_set_row(name, f))
        for t, tf in (f.turns or {}).items():
            lines.append(_set_row(f"{name}, turn {t}", tf))
    for name, f in sets.items():
        cats = f.categories
        if not cats:
            continue
        lines += [
            "",
            f"{name} per category ({f.questions} questions, every turn):",
            "",
            "| category | prompts decoded | vLLM | ours (vLLM-style) | ours (per step) | "
            "per position |",
            "|---|---:|---:|---:|---:|---|",
        ]
        lines += [_set_row(c, cf) for c, cf in cats.items()]
    lines += ["", "Sets:", ""]
    lines += [f"- `{name}`: {f.description}" for name, f in sets.items()]
    if "mt_bench" in sets:
        from eagle3_pipeline.validate.prompt_sets import MT_BENCH_PROTOCOL

        full = sets["mt_bench"].questions == 80 and max_new_tokens == 256 and k == 3
        lines.append(
            f"- MT-Bench here: {sets['mt_bench'].questions} of 80 questions x "
            f"{max_new_tokens} new tokens, K={k}, temperature 0"
            + (
                f": the full protocol, {MT_BENCH_PROTOCOL}."
                if full
                else f"; the full protocol ({MT_BENCH_PROTOCOL}) is "
                "`-S validate.num_prompts=null -S validate.max_new_tokens=256 -S validate.k=3`."
            )
        )
    lines += ["", "![per-position acceptance per prompt set](acceptance_by_set.png)"]
    return lines


def _acceptance_table(record: ValidateRecord) -> list[str]:
    lines = [
        "| position | accepted | rate (of steps) | conditional rate |",
        "|---:|---:|---:|---:|",
    ]
    for i in range(record.k):
        lines.append(
            f"| {i + 1} | {record.ours.accepted_per_pos[i]} | "
            f"{_fmt(record.ours.per_position_rate[i])} | "
            f"{_fmt(record.ours.per_position_conditional[i])} |"
        )
    return lines


def markdown_report(record: ValidateRecord, facts: ReportFacts) -> str:
    t = facts.target
    lines = [
        "# EAGLE-3 draft validation",
        "",
        f"Draft `{facts.draft_dir}` for target `{t.id}`"
        + (f" (revision `{t.revision}`)" if t.revision else ""),
        "",
        "## Verdicts",
        "",
        f"- Checkpoint (vLLM + speculators loading rules): **PASS**, "
        f"{record.checkpoint_errors} error(s), {record.checkpoint_warnings} warning(s) "
        "(a checkpoint with errors stops the stage before anything is measured)",
        f"- Lossless (speculative output == plain greedy): "
        f"**{_fmt(record.lossless)}** ({record.lossless_prompts}/{record.ours.prompts} prompts, "
        f"{record.dtype} on {record.device})",
    ]
    for d in record.divergences[:10]:
        lines.append(
            f"  - prompt {d.prompt}: first divergence at token {d.position}, "
            f"target top-2 logit margin {_fmt(d.top2_margin, 4)}"
        )
    lines += [
        "",
        "## Acceptance length",
        "",
        f"**{_fmt(record.acceptance_length)} tokens per target step** at K={record.k} "
        f"(chained greedy speculative decoding, {record.ours.prompts} prompts of every set, "
        f"at most {record.max_new_tokens} new tokens each, {record.ours.tokens} tokens generated, "
        f"{record.ours.steps} verification forwards; the prefill is excluded). "
        f"vLLM-style 1 + accepted/drafts: {_fmt(record.ours.vllm_style_acceptance_length)}.",
        "",
        *_acceptance_table(record),
        "",
        "![per-position acceptance](acceptance.png)",
    ]
    if record.sets:
        lines[lines.index("## Acceptance length") : lines.index("## Acceptance length")] = [
            "## Acceptance length per prompt set",
            "",
            *sets_lines(
                record.sets,
                record.k,
                record.max_new_tokens,
                record.vllm.proof_concurrency if record.vllm else 1,
            ),
            "",
        ]
    v = record.vllm
    if v:
        lines += ["", "## In vLLM", "", *_vllm_lines(v)]
        lines += serving_lines(v, record.k, record.max_new_tokens)
    if facts.serve_command:
        lines += ["", "## Serve it", "", f"```\n{facts.serve_command}\n```"]
    if facts.findings:
        lines += ["", "## Checkpoint findings", "", "```", *facts.findings, "```"]
    return "\n".join(lines) + "\n"


def _vllm_lines(v: VllmFigures) -> list[str]:
    per_pos = [_fmt(r) for r in v.per_position_rate]
    g = v.serving_greedy
    lines = [
        f"- Acceptance length from vLLM's counters (1 + accepted/drafts): "
        f"**{_fmt(v.mean_acceptance_length)}** ({v.num_accepted_tokens} "
        f"accepted / {v.num_drafts} drafts; per position "
        f"{v.num_accepted_tokens_per_pos}, rates {per_pos}); ours: "
        f"{_fmt(v.ours_acceptance_length)} (per position {v.ours_accepted_per_pos}).",
        f"- Lossless in vLLM (greedy with the draft == greedy without it): "
        f"**{_fmt(v.lossless)}** ({v.lossless_prompts}/{v.prompts} prompts"
        + (f", {v.dtype}" if g else "")
        + (
            f", {v.proof_concurrency} requests in flight)."
            if (v.proof_concurrency or 1) > 1
            else ")."
        ),
        f"- Single-stream generation: {_fmt(v.tokens_per_s_without_draft, 1)} tokens/s "
        f"without the draft, {_fmt(v.tokens_per_s_with_draft, 1)} with it: "
        f"**{_fmt(v.speedup, 2)}x** ({_speed_prompts(v)}{v.mode} mode, {v.speed_dtype()}).",
        *precision_lines(v),
        "",
        (
            f"Engines (the proof's in {v.dtype}, with the draft then the target alone; then "
            f"the speed's in {v.serving_dtype}, likewise):"
            if g
            else "Engines (with the draft, then the target alone):"
        ),
        "",
        "```",
        *(v.commands or {}).values(),
        "```",
    ]
    return lines


def _speed_prompts(v: VllmFigures) -> str:
    """What the single-stream figures were measured over: the prompts where a subset."""
    g = v.serving_greedy
    tokens = g.generated_tokens if g else v.generated_tokens
    if v.speed_prompts is not None and v.speed_prompts != v.prompts:
        return f"{v.speed_prompts} of the {v.prompts} prompts (validate.speed_prompts), "
    return f"{tokens} tokens, "


def precision_lines(v: VllmFigures) -> list[str]:
    """Which precision each figure came from, and why (nothing for a record from before
    the serving precision was recorded)."""
    if v.serving_dtype is None:
        return []
    g = v.serving_greedy
    if g is None:
        return [f"- Every vLLM figure in {v.serving_dtype} ({v.serving_dtype_why})."]
    return [
        f"- Precision: the acceptance and losslessness above in {v.dtype} (the proof: vLLM's "
        f"counters and our evaluator agree exactly there); every speed figure (tokens/s, "
        f"speedups, sampled, under load, K) in **{v.serving_dtype}** ({v.serving_dtype_why}), "
        "as a user serves the target, on engines of its own. There vLLM's greedy acceptance "
        f"length is {_fmt(g.mean_acceptance_length)} ({g.num_accepted_tokens} accepted / "
        f"{g.num_drafts} drafts) and its output with the draft equals its output without on "
        f"{g.lossless_prompts}/{v.speed_prompts or v.prompts} prompts (reported, not judged: "
        "rounding may flip "
        "a near-tie).",
    ]


def model_card(record: ValidateRecord, facts: ReportFacts) -> str:
    """README.md for publishing the draft (Hugging Face model-card front matter)."""
    t, data, draft, versions = facts.target, facts.data, facts.draft, facts.versions
    front = [
        "---",
        "library_name: speculators",
        "tags:",
        "- speculative-decoding",
        "- eagle3",
        *([f"base_model: {t.hub_id}"] if t.hub_id else []),
        "---",
        "",
    ]
    lines = [
        f"# EAGLE-3 draft for {t.id}",
        "",
        "A speculative-decoding draft (EAGLE-3, trained with "
        f"[speculators](https://github.com/vllm-project/speculators) "
        f"{versions.get('speculators') or ''}) for the target model `{t.id}`"
        + (
            f" at revision `{t.revision}`."
            if t.revision
            else " (no pinned revision: a locally built target)."
        ),
        "",
        "## Use with vLLM",
        "",
        "```",
        facts.serve_command
        or "vllm serve TARGET --speculative-config "
        f'\'{{"method":"eagle3","model":"DRAFT","num_speculative_tokens":{record.k}}}\'',
        "```",
        "",
        "## Draft",
        "",
        f"- Target architecture (vLLM name): `{t.vllm_architecture}`",
        f"- Aux hidden-state layers of the target: {t.aux_layer_ids}",
        f"- Draft tokens per step (K): {record.k}",
        f"- Draft shape: {draft.shape or 'see config.json'}",
        f"- Draft vocabulary: {draft.vocab_size or 'see config.json'}",
        "",
        "## Acceptance length",
        "",
        f"**{_fmt(record.acceptance_length)}** tokens per target forward at K={record.k}, "
        f"measured by chained greedy speculative decoding against the target on "
        f"{record.ours.prompts} prompts never trained on (at most "
        f"{record.max_new_tokens} new tokens each, {record.ours.tokens} tokens, "
        f"{record.ours.steps} verification forwards, prefill excluded; {record.dtype} on "
        f"{record.device}). Per-position acceptance rates: "
        f"{[_fmt(r) for r in record.ours.per_position_rate]}. "
        f"Output identical to the target's greedy decoding: {_fmt(record.lossless)}.",
    ]
    for name, f in (record.sets or {}).items():
        lines.append(
            f"- {name} ({f.ours.prompts} prompts): {_fmt(f.acceptance())} "
            f"({'vLLM counters' if f.vllm else 'our decoder'}, K={record.k}, T=0)"
        )
    v = record.vllm
    if v:
        lines.append(
            f"vLLM's own counters (1 + accepted/drafts) gave "
            f"{_fmt(v.mean_acceptance_length)}; single-stream speedup in vLLM "
            f"{_fmt(v.speedup, 2)}x ({v.speed_dtype() or record.dtype} on {record.device})."
        )
        if v.sampled:
            s = v.sampled
            lines.append(
                f"At temperature {s.temperature} (vLLM's rejection sampler, K={record.k}"
                f"{in_dtype(v.speed_dtype())}): "
                + ", ".join(f"{n} {_fmt(f.mean_acceptance_length)}" for n, f in s.sets.items())
                + "."
            )
        if v.concurrency:
            lines.append(
                f"Speedup in vLLM per requests in flight (T=0{in_dtype(v.speed_dtype())}): "
                + ", ".join(f"{r.concurrency}: {_fmt(r.speedup, 2)}x" for r in v.concurrency.levels)
                + "."
            )
    lines += [
        "",
        "## Training data",
        "",
        f"- Source: {data.source}" + (f" ({data.path})" if data.path else ""),
        f"- Licence: {data.license}",
        f"- Conversations: {data.samples} requested (train.samples); "
        f"assistant turns regenerated by the target: {data.regenerate}",
        "",
        "## Reproducibility",
        "",
        f"- Seed: {facts.seed}",
        *[f"- {name}: {ver}" for name, ver in versions.items() if ver],
        "",
        "Trained and validated by the eagle3-pipeline DVC graph "
        "(preflight -> target -> prepare -> extract -> train -> validate).",
    ]
    return "\n".join(front + lines) + "\n"


def validation_files(record: ValidateRecord, facts: ReportFacts) -> dict[str, bytes]:
    """data/validate/'s files by name: report.md, README.md (the model card), acceptance.png."""
    name = facts.target.name
    title = f"{name}: acceptance length {record.acceptance_length or 0:.2f} at K={record.k}"
    files = {
        "report.md": markdown_report(record, facts).encode("utf-8"),
        "README.md": model_card(record, facts).encode("utf-8"),
        "acceptance.png": acceptance_png(record, title),
    }
    v = record.vllm
    conc = v.concurrency if v else None
    if v and conc and any(r.speedup is not None for r in conc.levels):
        dtype = v.speed_dtype()
        files["speedup_by_concurrency.png"] = concurrency_png(
            conc,
            f"{name}: speedup per requests in flight, K={record.k}, T=0"
            + (f", {dtype}" if dtype else ""),
        )
    if record.sets:
        files["acceptance_by_set.png"] = sets_png(
            record.sets, record.k, f"{name}: acceptance per prompt set, K={record.k}"
        )
    return files
