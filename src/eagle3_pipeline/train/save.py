"""The trained draft in the format vLLM serves it from: speculators' (``save_pretrained``)
for llama and qwen3 layers, the plain DeepSeek config for the MLA layer
(``draft/mla_format.py``; the weights are ``save_pretrained``'s either way)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.io import atomic_dir, atomic_write_text
from eagle3_pipeline.draft import mla_format
from eagle3_pipeline.draft.mla import LAYER_MODEL_TYPE
from eagle3_pipeline.train.errors import TrainingError


def portable_verifier(name: str | None, out_dir: Path) -> str | None:
    """What the published config names as its verifier: a hub id as is; a local target
    as a path relative to the draft directory (``../target/model``), so the same training
    in another clone, or pulled onto another machine, gives the same bytes. The absolute
    path is handed to speculators and vLLM at load time only."""
    if not name or not Path(name).is_absolute():
        return name
    return os.path.relpath(name, out_dir.resolve())


def save_draft(
    model: Any, out_dir: Path, speculative_tokens: int, state_dict: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``save_pretrained`` into ``out_dir`` atomically; return the written config.

    ``state_dict``: the full weights when the model is FSDP-sharded (gathered on rank 0,
    as speculators' ``DistributedCheckpointer`` does); None = the model's own."""
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp), state_dict=state_dict)
        cfg_path = tmp / "config.json"
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
        # Written explicitly: vLLM's defaults differ from speculators' or are absent.
        config["norm_before_residual"] = bool(model.config.norm_before_residual)
        config.setdefault("transformer_layer_config", {})["num_aux_hidden_states"] = len(
            model.config.eagle_aux_hidden_state_layer_ids
        )
        verifier = config["speculators_config"]["verifier"]
        verifier["name_or_path"] = portable_verifier(verifier.get("name_or_path"), out_dir)
        methods = config["speculators_config"]["proposal_methods"]
        if methods[0].get("speculative_tokens") != speculative_tokens:
            raise TrainingError("speculative_tokens was not written to the draft config")
        if model.config.transformer_layer_config.model_type == LAYER_MODEL_TYPE:
            config = mla_format.served_config(
                model.config, verifier["name_or_path"], speculative_tokens
            )
            (tmp / "config.py").unlink(missing_ok=True)  # speculators' auto_map class
        atomic_write_text(cfg_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config
