"""Kimi-K2.5: a DeepSeek-V3 text model nested under ``text_config`` beside a vision tower.

Its quirks: the language model's weights live under ``language_model.``; transformers
registers the architecture as ``Kimi_K25ForConditionalGeneration`` and vLLM (and the real
checkpoint) as ``KimiK25ForConditionalGeneration``; the checkpoint loads with an
image-text Auto class. The tiny Kimi built here is a real transformers ``kimi_k25``
model saved under the real checkpoint's names and config keys, so the nested-target code
is exercised, not bypassed.

Its chat format (role markers, ``<|im_end|>``, a ``<think>`` block) is also the one every
tiny target speaks (:mod:`eagle3_pipeline.targets.tiny`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_pipeline.core.io import atomic_write_json
from eagle3_pipeline.targets.families.base import (
    Family,
    TinyBuilder,
    WeightNames,
    tiny_common_config,
    tiny_rope_parameters,
)
from eagle3_pipeline.targets.families.deepseek_v3 import DEEPSEEK_MOE, tiny_text_config

if TYPE_CHECKING:
    from eagle3_pipeline.core.config import TinyModelConfig

# --------------------------------------------------------------------------- chat format

# Role markers, a middle separator, an end-of-turn token and a reasoning block. The media
# tokens exist so the vision ids are inside a tiny vocabulary.
IM_SYSTEM, IM_USER, IM_ASSISTANT = "<|im_system|>", "<|im_user|>", "<|im_assistant|>"
IM_MIDDLE, IM_END = "<|im_middle|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
MEDIA = ("<|media_start|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>", "<|video_pad|>")
CHAT_TOKENS = (IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END, THINK, END_THINK, *MEDIA)
END_OF_TURN = IM_END
REASONING_MARKERS = (THINK, END_THINK)

# Like Kimi-K2.5's template in thinking mode: the assistant turns after the last user
# message keep their reasoning inside <think>...</think>; earlier ones are rendered with
# an empty <think></think>, so past reasoning is dropped exactly as at inference.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}"
    "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}"
    "<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'user' -%}"
    "<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'assistant' -%}"
    "<|im_assistant|>assistant<|im_middle|>"
    "{%- if loop.index0 > ns.last_user and m.get('reasoning_content') -%}"
    "<think>{{ m['reasoning_content'] }}</think>"
    "{%- else -%}<think></think>{%- endif -%}"
    "{{ m['content'] }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)

# --------------------------------------------------------------------------- the real layout

# transformers 5.19's save_pretrained does not quite invert its own kimi_k25 load-time
# renames; these put the names back where the real checkpoint (and vLLM) has them.
_KIMI_RENAMES = (
    # its global ``blocks -> layers`` rule is meant for the vision tower
    (re.compile(r"^language_model\.model\.blocks\.(\d+)\."), r"language_model.model.layers.\1."),
    (re.compile(r"^model\.mm_projector\."), "mm_projector."),
    (re.compile(r"^vision_tower\.encoder\.patch_embed\."), "vision_tower.patch_embed."),
)


def _kimi_name(name: str) -> str:
    for pattern, repl in _KIMI_RENAMES:
        name = pattern.sub(repl, name)
    return name


def rename_to_kimi_layout(model_dir: Path) -> int:
    """Rewrite shard tensor names and the index to the real Kimi layout; return count."""
    from safetensors.torch import load_file, save_file

    renamed = 0
    index_path = model_dir / "model.safetensors.index.json"
    shards = sorted(model_dir.glob("*.safetensors"))
    for shard in shards:
        tensors = load_file(shard)
        new = {_kimi_name(k): v for k, v in tensors.items()}
        changed = sum(1 for k in tensors if _kimi_name(k) != k)
        if changed:
            renamed += changed
            save_file(new, str(shard), metadata={"format": "pt"})
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        index["weight_map"] = {_kimi_name(k): v for k, v in index["weight_map"].items()}
        index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return renamed


# The real checkpoint's image-processor settings (MoonViT: 14-px patches, 2x2 merge).
# vLLM's Kimi-K2.5 processor reads this file at start-up even for text-only requests.
KIMI_PREPROCESSOR: dict[str, Any] = {
    "media_proc_cfg": {
        "in_patch_limit": 16384,
        "patch_size": 14,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_kernel_size": 2,
        "fixed_output_tokens": None,
        "patch_limit_on_one_side": 512,
        "in_patch_limit_each_frame": 4096,
        "in_patch_limit_video": None,
        "sample_fps": 2.0,
        "max_num_frames_each_video": None,
        "temporal_merge_kernel_size": 4,
        "timestamp_mode": "hh:mm:ss.fff",
        "config_type": "image",
    }
}


def kimi_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config transformers wrote, reshaped to the real Kimi-K2.5 ``config.json``.

    vLLM keys on the real architecture name (``KimiK25...``, not transformers'
    ``Kimi_K25...``), builds ``gate.e_score_correction_bias`` only for
    ``topk_method: noaux_tc``, and its EAGLE proposer reads
    ``media_placeholder_token_id``. The real vision keys (``vt_*``) are added beside
    transformers' own so both readers find what they expect; rope scaling is written in
    the real spelling (``rope_scaling`` + ``rope_theta``), which transformers converts on
    load.
    """
    out = dict(cfg)
    text = dict(out["text_config"])
    vision = dict(out["vision_config"])
    out["architectures"] = ["KimiK25ForConditionalGeneration"]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        out[key] = text[key]
    out["ignore_index"] = -100
    out["media_placeholder_token_id"] = out["image_token_id"]
    out["use_unified_vision_chunk"] = True
    out["video_placeholder"] = "<|kimi_k25_video_placeholder|>"
    text["architectures"] = ["DeepseekV3ForCausalLM"]
    text["topk_method"] = "noaux_tc"
    text["scoring_func"] = "sigmoid"
    text["moe_layer_freq"] = 1
    text["num_nextn_predict_layers"] = 0
    text["tie_word_embeddings"] = False
    text["dtype"] = out.get("dtype", "float32")
    rope = dict(text.pop("rope_parameters", None) or {})
    text["rope_theta"] = rope.pop("rope_theta", 10000.0)
    kind = rope.pop("rope_type", "default")
    text["rope_scaling"] = {"type": kind, **rope} if kind != "default" else None
    vision.update(
        {
            "init_pos_emb_height": vision["pos_emb_height"],
            "init_pos_emb_width": vision["pos_emb_width"],
            "init_pos_emb_time": vision["pos_emb_time"],
            "pos_emb_type": "divided_fixed",
            "merge_type": "sd2_tpool",
            "video_attn_type": "spatial_temporal",
            "vt_hidden_size": vision["hidden_size"],
            "vt_intermediate_size": vision["intermediate_size"],
            "vt_num_attention_heads": vision["num_attention_heads"],
            "vt_num_hidden_layers": vision["num_hidden_layers"],
            "mm_hidden_size": vision["hidden_size"],
            "mm_projector_type": "patchmerger",
            "projector_hidden_act": "gelu",
            "projector_ln_eps": out.get("projection_layer_norm_eps", 1e-5),
            "text_hidden_size": text["hidden_size"],
        }
    )
    out["text_config"], out["vision_config"] = text, vision
    return out


def write_kimi_config(model_dir: Path) -> None:
    path = model_dir / "config.json"
    atomic_write_json(path, kimi_config(json.loads(path.read_text(encoding="utf-8"))))


def to_real_layout(model_dir: Path) -> None:
    """What save_pretrained wrote -> the real checkpoint's names, config and processor."""
    rename_to_kimi_layout(model_dir)
    write_kimi_config(model_dir)
    atomic_write_json(model_dir / "preprocessor_config.json", KIMI_PREPROCESSOR)


# --------------------------------------------------------------------------- the tiny Kimi


def build_tiny(shape: TinyModelConfig, common: dict[str, Any], tokenizer: Any) -> Any:
    """transformers' native kimi_k25: a DeepSeek-V3 MLA + MoE text model and a one-layer
    vision tower, the media token ids taken from the tiny tokenizer."""
    from transformers import DeepseekV3Config, Kimi_K25Config, Kimi_K25ForConditionalGeneration
    from transformers.models.kimi_k25.configuration_kimi_k25 import Kimi_K25VisionConfig

    text = DeepseekV3Config(
        **tiny_text_config(shape),
        n_group=1,
        topk_group=1,
        rope_parameters=tiny_rope_parameters(shape),
        **common,
    )
    vision = Kimi_K25VisionConfig(
        patch_size=14,
        pos_emb_height=4,
        pos_emb_width=4,
        pos_emb_time=1,
        num_attention_heads=2,
        num_hidden_layers=1,
        hidden_size=32,
        intermediate_size=64,
    )
    ids = tokenizer.convert_tokens_to_ids
    cfg = Kimi_K25Config(
        text_config=text,
        vision_config=vision,
        projection_hidden_size=32,
        image_token_id=ids("<|media_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|media_start|>"),
        vision_end_token_id=ids("<|media_end|>"),
        tie_word_embeddings=False,
    )
    return Kimi_K25ForConditionalGeneration(cfg)


def tiny_config(tiny: TinyModelConfig) -> dict[str, Any]:
    """The config of the tiny Kimi from its shape alone (what the plan describes)."""
    text = {"model_type": "deepseek_v3", **tiny_text_config(tiny), **tiny_common_config(tiny)}
    return {
        "model_type": "kimi_k25",
        "architectures": ["Kimi_K25ForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64},
        "tie_word_embeddings": False,
    }


FAMILY = Family(
    name="kimi_k25",
    model_types=("kimi_k25",),
    architectures=("KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration"),
    vllm_architecture="KimiK25ForConditionalGeneration",
    vllm_eagle3=True,
    text_config_keys=("text_config",),
    weights=WeightNames(
        decoder_prefixes=("language_model.model.",), lm_head=("language_model.lm_head.weight",)
    ),
    moe=DEEPSEEK_MOE,
    end_of_turn=END_OF_TURN,
    reasoning_markers=REASONING_MARKERS,
    auto_class="AutoModelForImageTextToText",
    tiny=TinyBuilder(build=build_tiny, config=tiny_config, finalize=to_real_layout),
)
