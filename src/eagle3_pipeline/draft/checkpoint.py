"""A trained draft directory, in whichever format its layer type is served in: speculators'
(llama, qwen3) or the plain DeepSeek config of the MLA draft (``draft/mla_format.py``).
Every reload of a draft (validate's evaluator, the checkpoint validator, warm starts)
goes through :func:`load_trained_draft`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagle3_pipeline.draft import mla_format


def read_config(draft_dir: str | Path) -> dict[str, Any]:
    path = Path(draft_dir) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FileNotFoundError(f"{path}: not a readable draft config ({exc})") from None
    if not isinstance(data, dict):
        raise FileNotFoundError(f"{path}: not a JSON object")
    return data


def load_trained_draft(
    draft_dir: str | Path,
    verifier_dir: str | Path,
    attn_implementation: str = "sdpa",
    device: str = "cpu",
) -> Any:
    """The ``Eagle3DraftModel`` saved in ``draft_dir``, its verifier the local target
    ``verifier_dir``; eval mode, on ``device``."""
    from eagle3_pipeline.compat.speculators import load_draft

    config = read_config(draft_dir)
    if not mla_format.is_served_mla(config):
        return load_draft(draft_dir, verifier_dir, attn_implementation, device)
    return _load_mla(Path(draft_dir), Path(verifier_dir), config, attn_implementation, device)


# What a saved draft lacks on purpose: speculators drops these on save and takes them
# from the verifier (load_verifier_weights).
FROM_VERIFIER = ("verifier_lm_head.weight", "verifier_norm.weight", "embed_tokens.weight")


def _load_mla(
    draft_dir: Path, verifier_dir: Path, config: dict[str, Any], attn: str, device: str
) -> Any:
    """speculators' ``from_pretrained`` reads only its own config format, so the model is
    built from the converted config and the weights are loaded strictly (every trainable
    tensor present, nothing unknown), the verifier's frozen tensors from the target."""
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel

    if not (verifier_dir / "config.json").is_file():
        raise FileNotFoundError(f"{verifier_dir}: no config.json (need the local target directory)")
    spec_config = mla_format.speculators_config(config, str(verifier_dir.resolve()), attn)
    model: Any = Eagle3DraftModel(config=spec_config)
    state: dict[str, Any] = {}
    for path in sorted(draft_dir.glob("*.safetensors")):
        state.update(load_file(str(path)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m not in FROM_VERIFIER]
    if missing or unexpected:
        raise ValueError(
            f"{draft_dir}: weights do not match the config (missing {missing[:3]}, "
            f"unknown {unexpected[:3]})"
        )
    model.load_verifier_weights()
    dtype = state["fc.weight"].dtype if "fc.weight" in state else None
    if dtype is not None:
        model = model.to(dtype=dtype)
    published = ((config.get(mla_format.PIPELINE_KEY) or {}).get("verifier") or {}).get(
        "name_or_path"
    )
    model.config.speculators_config.verifier.name_or_path = published
    return model.to(device).eval()
