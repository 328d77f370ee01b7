"""Working directories shaped like a run of the graph, for tests of later stages."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def make_workdir(
    tiny_target: Path, root: Path, n_prompts: int = 3, layer_type: str = "llama"
) -> Path:
    """A copy of the tiny target's workdir with a draft (of ``layer_type``) saved as the
    train stage saves it and held-out prompts in the prepare stage's format."""
    from record_samples import train_record
    from transformers import AutoTokenizer

    from eagle3_pipeline.core.config import DraftShapeConfig
    from eagle3_pipeline.core.corpus import builtin_conversations
    from eagle3_pipeline.draft.shape import build_draft, build_vocab_mapping, resolve_draft_shape
    from eagle3_pipeline.targets.adapter import load_target_spec
    from eagle3_pipeline.targets.chat import render_ids
    from eagle3_pipeline.train.save import save_draft
    from eagle3_pipeline.validate.run import stop_token_ids

    shutil.copytree(tiny_target / "conf", root / "conf")
    shutil.copytree(tiny_target / "data" / "target", root / "data" / "target")
    spec = load_target_spec(root / "data" / "target" / "target.json")
    model_dir = root / (spec.path or "")
    spec = dataclasses.replace(spec, path=str(model_dir))
    tok = AutoTokenizer.from_pretrained(model_dir)
    stops = stop_token_ids(model_dir)
    torch.manual_seed(0)
    d2t, t2d = build_vocab_mapping(
        {i: 1 for i in range(spec.vocab_size)}, 1024, spec.vocab_size, stops
    )
    options = DraftShapeConfig(layer_type=layer_type)  # type: ignore[arg-type]
    shape = resolve_draft_shape(options, spec)
    # the llama draft without the EAGLE-3.1 options (what the tests of later stages expect)
    model = build_draft(
        spec,
        shape,
        3,
        1024,
        d2t,
        t2d,
        model_dir,
        "sdpa",
        options=options if layer_type == "mla" else None,
    )
    save_draft(model, root / "data" / "draft", 3)
    rows = []
    for i, c in enumerate(builtin_conversations(0)[:n_prompts]):
        msgs = c["messages"][:1]
        rows.append(
            {
                "id": f"p{i}",
                "messages": msgs,
                "prompt_ids": render_ids(tok, msgs, generation_prompt=True),
            }
        )
    held = root / "data" / "heldout" / "prompts.jsonl"
    held.parent.mkdir(parents=True)
    held.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the train stage's details, as it writes them (validate never reads them)
    train_record(draft_vocab_size=1024, train_rows=10, target=spec.name).write(
        root / "metrics" / "details" / "train.json"
    )
    return root


def repo_copy(root: Path, commit: bool = False) -> Path:
    """The repository's tracked and untracked-but-not-ignored files, in a new git repo
    (committed when ``commit``: ``dvc exp run`` needs a commit)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, root / rel)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    if commit:
        commit_all(root, "copy")
    return root


def commit_all(root: Path, message: str) -> None:
    """``git add -A`` and commit in ``root``, under a fixed identity (CI has none)."""
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message],
        cwd=root,
        check=True,
    )
