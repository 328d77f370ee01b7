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

from eagle3_pipeline.validate.report_serving import concurrency_png, serving_lines
from eagle3_pipeline.validate.report_serving import fmt as _fmt

PACKAGES = ("eagle3-pipeline", "speculators", "torch", "transformers", "vllm", "dvc")


def acceptance_png(acc: dict[str, Any], title: str) -> bytes:
    """Per-position acceptance rates (and conditional rates) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = acc["k"]
    pos = list(range(1, k + 1))
    rate = [r if r is not None else 0.0 for r in acc["per_position_rate"]]
    cond = [r if r is not None else 0.0 for r in acc["per_position_conditional"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.4
    ax.bar([p - width / 2 for p in pos], rate, width, label="accepted / steps")
    ax.bar([p + width / 2 for p in pos], cond, width, label="accepted / steps reaching position")
    ax.set_xticks(pos)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def sets_png(sets: dict[str, dict[str, Any]], k: int, title: str) -> bytes:
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
        rates = (f.get("vllm") or {}).get("per_position_rate") or f["ours"]["per_position_rate"]
        rates = [r if r is not None else 0.0 for r in rates][:k]
        xs = [i + 1 - 0.4 + width * (j + 0.5) for i in range(len(rates))]
        ax.bar(xs, rates, width, label=f"{name} ({_fmt(_set_length(f))})")
    ax.set_xticks(list(range(1, k + 1)))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / verification steps")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, title="prompt set (acceptance length)", title_fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _set_length(f: dict[str, Any]) -> float | None:
    v = f.get("vllm")
    return v["mean_acceptance_length"] if v else f["ours"]["vllm_style_acceptance_length"]


def _set_row(label: str, f: dict[str, Any], prompts: int | str) -> str:
    v = f.get("vllm") or {}
    rates = v.get("per_position_rate") or f["ours"]["per_position_rate"]
    return (
        f"| {label} | {prompts} | **{_fmt(v.get('mean_acceptance_length'))}** | "
        f"{_fmt(f['ours']['vllm_style_acceptance_length'])} | "
        f"{_fmt(f['ours']['acceptance_length'])} | "
        f"{' / '.join(_fmt(r) for r in rates)} |"
    )


def sets_lines(sets: dict[str, dict[str, Any]], k: int, max_new_tokens: int) -> list[str]:
    """The per-set table (and MT-Bench's per-turn and per-category rows)."""
    lines = [
        f"Every figure at K={k}, temperature 0 (greedy), one request at a time (concurrency "
        f"1), at most {max_new_tokens} new tokens per prompt. vLLM: 1 + accepted/drafts "
        "from its spec-decode counters; ours: the same definition from our decoder, and "
        "tokens per verification step (end effects included).",
        "",
        "| prompt set | prompts decoded | vLLM | ours (vLLM-style) | ours (per step) | "
        "per position (rate of steps) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, f in sets.items():
        lines.append(_set_row(name, f, f["ours"]["prompts"]))
        for t, tf in (f.get("turns") or {}).items():
            lines.append(_set_row(f"{name}, turn {t}", tf, tf["ours"]["prompts"]))
    for name, f in sets.items():
        cats = f.get("categories")
        if not cats:
            continue
        lines += [
            "",
            f"{name} per category ({f['questions']} questions, every turn):",
            "",
            "| category | prompts decoded | vLLM | ours (vLLM-style) | ours (per step) | "
            "per position |",
            "|---|---:|---:|---:|---:|---|",
        ]
        lines += [_set_row(c, cf, cf["ours"]["prompts"]) for c, cf in cats.items()]
    lines += ["", "Sets:", ""]
    lines += [f"- `{name}`: {f['description']}" for name, f in sets.items()]
    if "mt_bench" in sets:
        from eagle3_pipeline.validate.prompt_sets import MT_BENCH_PROTOCOL

        full = sets["mt_bench"]["questions"] == 80 and max_new_tokens == 256 and k == 3
        lines.append(
            f"- MT-Bench here: {sets['mt_bench']['questions']} of 80 questions x "
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


def _acceptance_table(acc: dict[str, Any]) -> list[str]:
    lines = [
        "| position | accepted | rate (of steps) | conditional rate |",
        "|---:|---:|---:|---:|",
    ]
    for i in range(acc["k"]):
        lines.append(
            f"| {i + 1} | {acc['accepted_per_pos'][i]} | "
            f"{_fmt(acc['per_position_rate'][i])} | "
            f"{_fmt(acc['per_position_conditional'][i])} |"
        )
    return lines


def markdown_report(m: dict[str, Any]) -> str:
    acc = m["acceptance"]
    ck = m["checkpoint"]
    lines = [
        "# EAGLE-3 draft validation",
        "",
        f"Draft `{m['draft_dir']}` for target `{m['target']['id']}`"
        + (f" (revision `{m['target']['revision']}`)" if m["target"].get("revision") else ""),
        "",
        "## Verdicts",
        "",
        f"- Checkpoint (vLLM + speculators loading rules): "
        f"**{'PASS' if ck['ok'] else 'FAIL'}**, {ck['errors']} error(s), "
        f"{ck['warnings']} warning(s)",
        f"- Lossless (speculative output == plain greedy): "
        f"**{_fmt(acc['lossless'])}** ({acc['lossless_prompts']}/{acc['prompts']} prompts, "
        f"{m['dtype']} on {m['device']})",
    ]
    for d in acc.get("divergences", [])[:10]:
        lines.append(
            f"  - prompt {d['prompt']}: first divergence at token {d['position']}, "
            f"target top-2 logit margin {_fmt(d['top2_margin'], 4)}"
        )
    lines += [
        "",
        "## Acceptance length",
        "",
        f"**{_fmt(acc['acceptance_length'])} tokens per target step** at K={acc['k']} "
        f"(chained greedy speculative decoding, {acc['prompts']} prompts of every set, "
        f"at most {acc['max_new_tokens']} new tokens each, {acc['tokens']} tokens generated, "
        f"{acc['steps']} verification forwards; the prefill is excluded). vLLM-style "
        f"1 + accepted/drafts: {_fmt(acc['vllm_style_acceptance_length'])}.",
        "",
        *_acceptance_table(acc),
        "",
        "![per-position acceptance](acceptance.png)",
    ]
    if m.get("sets"):
        lines[lines.index("## Acceptance length") : lines.index("## Acceptance length")] = [
            "## Acceptance length per prompt set",
            "",
            *sets_lines(m["sets"], acc["k"], acc["max_new_tokens"]),
            "",
        ]
    v = m.get("vllm")
    if v:
        lines += ["", "## In vLLM", "", *_vllm_lines(v)]
        lines += serving_lines(v, acc["k"], acc["max_new_tokens"])
    if ck.get("serve_command"):
        lines += ["", "## Serve it", "", f"```\n{ck['serve_command']}\n```"]
    if ck.get("findings"):
        lines += ["", "## Checkpoint findings", "", "```", *ck["findings"], "```"]
    return "\n".join(lines) + "\n"


def _vllm_lines(v: dict[str, Any]) -> list[str]:
    per_pos = [_fmt(r) for r in v.get("per_position_rate") or []]
    lines = [
        f"- Acceptance length from vLLM's counters (1 + accepted/drafts): "
        f"**{_fmt(v.get('mean_acceptance_length'))}** ({v.get('num_accepted_tokens')} "
        f"accepted / {v.get('num_drafts')} drafts; per position "
        f"{v.get('num_accepted_tokens_per_pos')}, rates {per_pos}); ours: "
        f"{_fmt(v.get('ours_acceptance_length'))} (per position "
        f"{v.get('ours_accepted_per_pos')}).",
        f"- Lossless in vLLM (greedy with the draft == greedy without it): "
        f"**{_fmt(v.get('lossless'))}** ({v.get('lossless_prompts')}/{v.get('prompts')} "
        f"prompts).",
        f"- Single-stream generation: {_fmt(v.get('tokens_per_s_without_draft'), 1)} tokens/s "
        f"without the draft, {_fmt(v.get('tokens_per_s_with_draft'), 1)} with it: "
        f"**{_fmt(v.get('speedup'), 2)}x** ({v.get('generated_tokens')} tokens, "
        f"{v.get('mode')} mode, {v.get('dtype')}).",
        "",
        "Engines (with the draft, then the target alone):",
        "",
        "```",
        *[f"{cmd}" for cmd in (v.get("commands") or {}).values()],
        "```",
    ]
    return lines


def model_card(m: dict[str, Any]) -> str:
    """README.md for publishing the draft (Hugging Face model-card front matter)."""
    acc = m["acceptance"]
    t = m["target"]
    data = m["data"]
    train = m.get("train") or {}
    versions = m["versions"]
    front = [
        "---",
        "library_name: speculators",
        "tags:",
        "- speculative-decoding",
        "- eagle3",
        *([f"base_model: {t['hub_id']}"] if t.get("hub_id") else []),
        "---",
        "",
    ]
    lines = [
        f"# EAGLE-3 draft for {t['id']}",
        "",
        "A speculative-decoding draft (EAGLE-3, trained with "
        f"[speculators](https://github.com/vllm-project/speculators) "
        f"{versions.get('speculators') or ''}) for the target model `{t['id']}`"
        + (
            f" at revision `{t['revision']}`."
            if t.get("revision")
            else " (no pinned revision: a locally built target)."
        ),
        "",
        "## Use with vLLM",
        "",
        "```",
        m["checkpoint"].get("serve_command")
        or "vllm serve TARGET --speculative-config "
        f'\'{{"method":"eagle3","model":"DRAFT","num_speculative_tokens":{acc["k"]}}}\'',
        "```",
        "",
        "## Draft",
        "",
        f"- Target architecture (vLLM name): `{t.get('vllm_architecture')}`",
        f"- Aux hidden-state layers of the target: {t.get('aux_layer_ids')}",
        f"- Draft tokens per step (K): {acc['k']}",
        f"- Draft shape: {train.get('draft_shape', 'see config.json')}",
        f"- Draft vocabulary: {train.get('draft_vocab_size', 'see config.json')}",
        "",
        "## Acceptance length",
        "",
        f"**{_fmt(acc['acceptance_length'])}** tokens per target forward at K={acc['k']}, "
        f"measured by chained greedy speculative decoding against the target on "
        f"{acc['prompts']} prompts never trained on (at most "
        f"{acc['max_new_tokens']} new tokens each, {acc['tokens']} tokens, {acc['steps']} "
        f"verification forwards, prefill excluded; {m['dtype']} on {m['device']}). "
        f"Per-position acceptance rates: "
        f"{[_fmt(r) for r in acc['per_position_rate']]}. "
        f"Output identical to the target's greedy decoding: {_fmt(acc['lossless'])}.",
    ]
    for name, f in (m.get("sets") or {}).items():
        lines.append(
            f"- {name} ({f['ours']['prompts']} prompts): {_fmt(_set_length(f))} "
            f"({'vLLM counters' if f.get('vllm') else 'our decoder'}, K={acc['k']}, T=0)"
        )
    v = m.get("vllm")
    if v:
        lines.append(
            f"vLLM's own counters (1 + accepted/drafts) gave "
            f"{_fmt(v.get('mean_acceptance_length'))}; single-stream speedup in vLLM "
            f"{_fmt(v.get('speedup'), 2)}x ({m['dtype']} on {m['device']})."
        )
        if v.get("sampled"):
            s = v["sampled"]
            lines.append(
                f"At temperature {s['temperature']} (vLLM's rejection sampler, K={acc['k']}): "
                + ", ".join(
                    f"{n} {_fmt(f['mean_acceptance_length'])}" for n, f in s["sets"].items()
                )
                + "."
            )
        if v.get("concurrency"):
            lines.append(
                "Speedup in vLLM per requests in flight (T=0): "
                + ", ".join(
                    f"{r['concurrency']}: {_fmt(r['speedup'], 2)}x"
                    for r in v["concurrency"]["levels"]
                )
                + "."
            )
    lines += [
        "",
        "## Training data",
        "",
        f"- Source: {data.get('source')}" + (f" ({data['path']})" if data.get("path") else ""),
        f"- Licence: {data.get('license')}",
        f"- Conversations: {train.get('samples', 'unknown')} requested (train.samples); "
        f"assistant turns regenerated by the target: {data.get('regenerate')}",
        "",
        "## Reproducibility",
        "",
        f"- Seed: {m['seed']}",
        *[f"- {name}: {ver}" for name, ver in versions.items() if ver],
        "",
        "Trained and validated by the eagle3-pipeline DVC graph "
        "(preflight -> target -> prepare -> extract -> train -> validate).",
    ]
    return "\n".join(front + lines) + "\n"


def validation_files(m: dict[str, Any]) -> dict[str, bytes]:
    """data/validate/'s files by name: report.md, README.md (the model card), acceptance.png."""
    acc = m["acceptance"]
    title = (
        f"{m['target']['name']}: acceptance length {acc['acceptance_length'] or 0:.2f} "
        f"at K={acc['k']}"
    )
    files = {
        "report.md": markdown_report(m).encode("utf-8"),
        "README.md": model_card(m).encode("utf-8"),
        "acceptance.png": acceptance_png(acc, title),
    }
    conc = (m.get("vllm") or {}).get("concurrency")
    if conc and any(r["speedup"] is not None for r in conc["levels"]):
        files["speedup_by_concurrency.png"] = concurrency_png(
            conc, f"{m['target']['name']}: speedup per requests in flight, K={acc['k']}, T=0"
        )
    if m.get("sets"):
        files["acceptance_by_set.png"] = sets_png(
            m["sets"], acc["k"], f"{m['target']['name']}: acceptance per prompt set, K={acc['k']}"
        )
    return files
