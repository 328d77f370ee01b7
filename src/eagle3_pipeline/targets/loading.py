"""Loading a target's language model with transformers, for any family the adapter knows.

The adapter's :class:`TargetSpec` says whether the config is nested and under which names
the language model's weights live, so Kimi-K2.5's DeepSeek-V3 text model loads from under
``language_model.`` without its vision tower, and a flat checkpoint loads as is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.targets.adapter import TargetSpec
from eagle3_pipeline.targets.families import decoder_layers_attrs, final_norm_attrs

# The attribute names of the decoder layers and final norm on any family's base model.
DECODER_LAYER_ATTRS = decoder_layers_attrs()
FINAL_NORM_ATTRS = final_norm_attrs()


def language_model_key_mapping(spec: TargetSpec) -> dict[str, str]:
    """Checkpoint name -> causal-LM name for the language model, from the adapter's
    resolved weight names (``language_model.model.*`` -> ``model.*`` for Kimi-K2.5; empty
    for a flat checkpoint)."""
    mapping: dict[str, str] = {}
    if spec.weight_prefix and spec.weight_prefix != "model.":
        mapping[f"^{re.escape(spec.weight_prefix)}"] = "model."
    lm_head = (spec.weights or {}).get("lm_head")
    if lm_head and lm_head != "lm_head.weight" and lm_head.endswith("lm_head.weight"):
        mapping[f"^{re.escape(lm_head.removesuffix('lm_head.weight'))}lm_head\\."] = "lm_head."
    return mapping


@dataclass
class LanguageModel:
    model: Any  # the causal LM (decoder + lm_head)
    decoder: Any  # the base model whose forward extraction runs (no lm_head)
    layers: Any  # its decoder layers
    norm: Any  # its final norm
    device: Any


def _first_attr(obj: Any, names: Sequence[str]) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def load_language_model(
    spec: TargetSpec, model_dir: Path, dtype: str, device: str = "cpu", gpu_count: int = 0
) -> LanguageModel:
    """Load only the target's language model (for Kimi-K2.5 the DeepSeek-V3 text model
    under ``language_model.``; the vision tower's weights are never materialized).

    The adapter's spec says whether the config is nested and under which names the
    language model's weights live, so no family is special-cased here."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        full = AutoConfig.from_pretrained(model_dir, trust_remote_code=spec.trust_remote_code)
        text = full.get_text_config() if spec.nested else full
        quant = getattr(full, "quantization_config", None)
        if quant is not None and getattr(text, "quantization_config", None) is None:
            text.quantization_config = quant
        kwargs: dict[str, Any] = {
            "config": text,
            "dtype": getattr(torch, dtype),
            "trust_remote_code": spec.trust_remote_code,
            "output_loading_info": True,
        }
        mapping = language_model_key_mapping(spec)
        if mapping:
            kwargs["key_mapping"] = mapping
        if device == "cuda":
            kwargs["device_map"] = "auto" if gpu_count > 1 else {"": 0}
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # the unused vision weights are listed
        try:
            loaded: Any = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
            model, info = loaded  # (model, loading info): output_loading_info=True
        finally:
            transformers.logging.set_verbosity(verbosity)
    except Exception as exc:
        raise StageError(
            f"{model_dir}: the target's language model cannot be loaded "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise StageError(
            f"{model_dir}: language-model weights missing from the checkpoint: "
            f"{', '.join(sorted(missing)[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    model.eval()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = _first_attr(decoder, DECODER_LAYER_ATTRS)
    norm = _first_attr(decoder, FINAL_NORM_ATTRS)
    if layers is None or norm is None:
        raise StageError(
            f"{model_dir}: cannot find the decoder layers ({', '.join(DECODER_LAYER_ATTRS)}) or "
            f"final norm ({', '.join(FINAL_NORM_ATTRS)}) of {type(decoder).__name__}"
        )
    if len(layers) != spec.num_layers:
        raise StageError(
            f"{model_dir}: the model has {len(layers)} decoder layers, target.json says "
            f"{spec.num_layers}: rerun the target stage"
        )
    dev = decoder.get_input_embeddings().weight.device
    return LanguageModel(model=model, decoder=decoder, layers=layers, norm=norm, device=dev)
