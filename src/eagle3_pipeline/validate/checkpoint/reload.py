"""The reload rule: does speculators itself load the draft back?

The format rules only model speculators' and vLLM's loaders; this asks speculators for
real, through the project's one reload function
(:func:`eagle3_pipeline.draft.checkpoint.load_trained_draft`). speculators and torch are
imported lazily: the other rules run without them.
"""

from __future__ import annotations

from pathlib import Path

from eagle3_pipeline.validate.checkpoint.report import Report


def check_reload(report: Report, draft_dir: Path, verifier_dir: Path | None) -> None:
    """Does speculators itself reload it? Config always; the model when a verifier is local."""
    try:
        from speculators import SpeculatorModelConfig
    except ImportError as exc:
        report.warning(
            "reload-skipped", "speculators", f"not importable ({exc}): reload not checked"
        )
        return
    if not _plain_mla(draft_dir):  # (the MLA draft's plain config is converted by us)
        try:
            cfg = SpeculatorModelConfig.from_pretrained(str(draft_dir))
        except Exception as exc:  # noqa: BLE001 - any refusal is the finding
            report.error(
                "reload", "config.json", f"speculators refuses the config: {_one_line(exc)}"
            )
            return
        if type(cfg).__name__ != "Eagle3SpeculatorConfig":
            report.error("reload", "config.json", f"speculators reads it as {type(cfg).__name__}")
            return
    if verifier_dir is None:
        report.warning(
            "reload-skipped",
            "config.json:speculators_config.verifier.name_or_path",
            "no local target directory: speculators parsed the config but the model reload "
            "(which reads the verifier) was not run; pass --target",
        )
        return
    _reload_model(report, draft_dir, verifier_dir)


def _plain_mla(draft_dir: Path) -> bool:
    from eagle3_pipeline.draft.checkpoint import read_config
    from eagle3_pipeline.draft.mla_format import is_served_mla

    try:
        return is_served_mla(read_config(draft_dir))
    except FileNotFoundError:
        return False


def _reload_model(report: Report, draft_dir: Path, verifier_dir: Path) -> None:
    """A reload that succeeds can still leave parameters unloaded: they come back NaN/Inf."""
    from eagle3_pipeline.draft.checkpoint import load_trained_draft

    try:
        model = load_trained_draft(draft_dir, verifier_dir)
    except Exception as exc:  # noqa: BLE001
        report.error(
            "reload",
            str(draft_dir),
            f"speculators cannot reload the draft (verifier {verifier_dir}): {_one_line(exc)}",
        )
        return
    import torch

    bad = [
        n
        for n, p in model.state_dict().items()
        if p.is_floating_point() and not bool(torch.isfinite(p).all())
    ]
    if bad:
        report.error(
            "reload",
            str(draft_dir),
            f"after speculators' reload these are NaN/Inf (never loaded): {bad[:5]}",
        )
    else:
        report.info("reload", str(draft_dir), f"speculators reloads it (verifier {verifier_dir})")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"
