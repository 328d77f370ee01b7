"""The embedded default target: a tiny Kimi-K2.5 (or Llama) built and trained locally.

Why build instead of download: nothing can be fetched from a model hub here, and a
newcomer's first ``dvc repro`` must run end to end on a laptop CPU. The tiny target is a
real transformers model of the real architecture (``kimi_k25``: nested ``text_config``,
DeepSeek-V3 MLA + MoE language model, a vision tower), saved under the real Kimi weight
names, so the pipeline's nested-target code is exercised, not bypassed.

Why train it: an untrained target produces noise, and a draft trained on noise says
nothing about acceptance. A few hundred steps on the built-in corpus make its greedy
continuations language-like; its held-out perplexity is recorded against a unigram
baseline of the same split.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import TargetStageConfig, TinyModelConfig
from eagle3_pipeline.core.io import atomic_write_json

log = logging.getLogger(__name__)

# Kimi-shaped special tokens: role markers, a middle separator, an end-of-turn token and
# a reasoning block. The media tokens exist so the vision ids are inside the tiny vocab.
BOS, EOS, PAD = "[BOS]", "[EOS]", "[PAD]"
IM_SYSTEM, IM_USER, IM_ASSISTANT = "<|im_system|>", "<|im_user|>", "<|im_assistant|>"
IM_MIDDLE, IM_END = "<|im_middle|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
MEDIA = ("<|media_start|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>", "<|video_pad|>")
SPECIAL_TOKENS = [
    BOS, EOS, PAD, IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END, THINK, END_THINK, *MEDIA
]
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


# --------------------------------------------------------------------------- tokenizer


def build_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained offline on ``texts``, with Kimi-like specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (BOS, IM_END, PAD)],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
    )
    return hf


# --------------------------------------------------------------------------- models


def build_model(shape: TinyModelConfig, tokenizer: Any, seed: int) -> Any:
    """Instantiate the tiny target with random weights (seeded)."""
    import torch

    torch.manual_seed(seed)
    vocab = len(tokenizer)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    common = dict(
        vocab_size=vocab,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=eos,
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )
    if shape.architecture == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(num_key_value_heads=max(1, shape.num_heads // 2), **common)
        return LlamaForCausalLM(cfg)

    from transformers import DeepseekV3Config, Kimi_K25Config, Kimi_K25ForConditionalGeneration
    from transformers.models.kimi_k25.configuration_kimi_k25 import Kimi_K25VisionConfig

    text = DeepseekV3Config(
        num_key_value_heads=shape.num_heads,
        q_lora_rank=shape.q_lora_rank,
        kv_lora_rank=shape.kv_lora_rank,
        qk_rope_head_dim=shape.qk_rope_head_dim,
        qk_nope_head_dim=shape.qk_nope_head_dim,
        v_head_dim=shape.v_head_dim,
        n_routed_experts=shape.n_routed_experts,
        num_experts_per_tok=shape.num_experts_per_tok,
        n_shared_experts=shape.n_shared_experts,
        moe_intermediate_size=shape.moe_intermediate_size,
        first_k_dense_replace=shape.first_k_dense_replace,
        n_group=1,
        topk_group=1,
        rope_parameters=_rope_parameters(shape),
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


def _rope_parameters(shape: TinyModelConfig) -> dict[str, Any]:
    """transformers 5 spells the real ``rope_scaling: {type: yarn, ...}`` as
    ``rope_parameters: {rope_type: yarn, rope_theta, ...}``."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": shape.rope_theta}
    if shape.rope_scaling:
        scaling = dict(shape.rope_scaling)
        params["rope_type"] = scaling.pop("type", scaling.pop("rope_type", "default"))
        params.update(scaling)
    return params


def language_model_forward(model: Any, input_ids: Any) -> Any:
    """Logits of the text path only (the vision tower is never run)."""
    return model(input_ids=input_ids).logits


# --------------------------------------------------------------------------- training


def render_corpus(tokenizer: Any, conversations: list[dict[str, Any]]) -> list[str]:
    return [tokenizer.apply_chat_template(c["messages"], tokenize=False) for c in conversations]


def split_heldout(items: list[Any], fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    n_held = max(1, int(round(len(items) * fraction)))
    held = sorted(order[:n_held])
    train = sorted(order[n_held:])
    return [items[i] for i in train], [items[i] for i in held]


def _token_stream(tokenizer: Any, texts: list[str]) -> list[int]:
    ids: list[int] = []
    for t in texts:
        ids.extend(tokenizer(t, add_special_tokens=False)["input_ids"])
    return ids


def _chunks(stream: list[int], seq_len: int) -> Any:
    import torch

    n = len(stream) // seq_len
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)


def train_model(
    model: Any,
    train_ids: list[int],
    settings: TargetStageConfig,
    seed: int,
    progress: bool = True,
) -> dict[str, float]:
    """Plain next-token training on packed chunks of the rendered corpus."""
    import torch
    from tqdm import tqdm

    chunks = _chunks(train_ids, settings.seq_len)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01)
    warmup = max(1, settings.train_steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(1, settings.train_steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    t0 = time.perf_counter()
    loss_val = float("nan")
    bar = tqdm(
        range(settings.train_steps), desc="train tiny target", disable=not progress, mininterval=1.0
    )
    for _step in bar:
        idx = torch.randint(0, chunks.shape[0], (settings.batch_size,), generator=gen)
        batch = chunks[idx]
        logits = language_model_forward(model, batch)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.detach().item()
        bar.set_postfix(loss=f"{loss_val:.3f}", refresh=False)
    model.eval()
    wall = time.perf_counter() - t0
    return {"final_train_loss": loss_val, "train_wall_s": wall, "train_steps": settings.train_steps}


def perplexity(model: Any, ids: list[int], seq_len: int) -> float:
    """Token-level perplexity of ``ids`` (packed chunks, first token of a chunk unscored)."""
    import torch

    chunks = _chunks(ids, seq_len)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, chunks.shape[0], 16):
            batch = chunks[start : start + 16]
            logits = language_model_forward(model, batch)
            nll = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                batch[:, 1:].reshape(-1),
                reduction="sum",
            )
            total += float(nll)
            count += batch[:, 1:].numel()
    return math.exp(total / max(1, count))


def unigram_perplexity(train_ids: list[int], eval_ids: list[int], vocab: int, seq_len: int) -> float:
    """Perplexity of an add-one unigram model fit on the train split, scored on exactly
    the tokens :func:`perplexity` scores (same chunks, first token of each unscored)."""
    counts = Counter(train_ids)
    total = len(train_ids) + vocab
    n = len(eval_ids) // seq_len
    scored = [t for c in range(n) for t in eval_ids[c * seq_len + 1 : (c + 1) * seq_len]]
    nll = -sum(math.log((counts.get(t, 0) + 1) / total) for t in scored)
    return math.exp(nll / max(1, len(scored)))


# --------------------------------------------------------------------------- saving


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
    vision.update({
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
    })
    out["text_config"], out["vision_config"] = text, vision
    return out


def write_kimi_config(model_dir: Path) -> None:
    path = model_dir / "config.json"
    atomic_write_json(path, kimi_config(json.loads(path.read_text(encoding="utf-8"))))


def save_target(model: Any, tokenizer: Any, out_dir: Path, max_shard_size: str) -> None:
    from transformers import GenerationConfig

    model.save_pretrained(out_dir, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(out_dir)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    GenerationConfig(
        eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, do_sample=False
    ).save_pretrained(out_dir)
    if getattr(model.config, "model_type", "") == "kimi_k25":
        rename_to_kimi_layout(out_dir)
        write_kimi_config(out_dir)
        atomic_write_json(out_dir / "preprocessor_config.json", KIMI_PREPROCESSOR)


def load_target_model(model_dir: Path, dtype: str = "float32") -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = AutoConfig.from_pretrained(model_dir)
    cls = AutoModelForImageTextToText if cfg.model_type == "kimi_k25" else AutoModelForCausalLM
    return cls.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()


def build_tiny_target(
    shape: TinyModelConfig,
    settings: TargetStageConfig,
    out_dir: Path,
    seed: int,
    progress: bool = True,
) -> dict[str, Any]:
    """Build, train and save the tiny target into ``out_dir``; return its metrics."""
    import torch

    from eagle3_pipeline.data.corpus import builtin_conversations

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    conversations = builtin_conversations(seed)
    train_convs, held_convs = split_heldout(conversations, settings.heldout_fraction, seed)
    plain = [m["content"] for c in train_convs for m in c["messages"]]
    plain += [m.get("reasoning_content", "") for c in train_convs for m in c["messages"]]
    tokenizer = build_tokenizer([t for t in plain if t], shape.vocab_size)
    # rendered for training: each prefix ending in an assistant turn, as the target sees it
    train_texts = render_corpus(tokenizer, _turn_prefixes(train_convs))
    held_texts = render_corpus(tokenizer, _turn_prefixes(held_convs))
    train_ids = _token_stream(tokenizer, train_texts)
    held_ids = _token_stream(tokenizer, held_texts)
    log.info("tokenizer: %d tokens; corpus: %d train / %d held-out tokens",
             len(tokenizer), len(train_ids), len(held_ids))

    model = build_model(shape, tokenizer, seed)
    n_params = sum(p.numel() for p in model.parameters())
    ppl_untrained = perplexity(model, held_ids, settings.seq_len)
    stats = train_model(model, train_ids, settings, seed, progress=progress)
    ppl = perplexity(model, held_ids, settings.seq_len)
    ppl_unigram = unigram_perplexity(train_ids, held_ids, len(tokenizer), settings.seq_len)

    save_target(model, tokenizer, out_dir, settings.max_shard_size)
    reloaded = load_target_model(out_dir)
    probe = torch.tensor([held_ids[: min(64, len(held_ids))]])
    with torch.no_grad():
        same = torch.equal(language_model_forward(model, probe), language_model_forward(reloaded, probe))
    if not same:
        raise RuntimeError(f"{out_dir}: reloaded target gives different logits")
    return {
        "architecture": shape.architecture,
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "train_tokens": len(train_ids),
        "heldout_tokens": len(held_ids),
        "heldout_perplexity": ppl,
        "heldout_perplexity_untrained": ppl_untrained,
        "unigram_perplexity": ppl_unigram,
        "perplexity_ratio_vs_unigram": ppl / ppl_unigram,
        "reload_logits_identical": same,
        "build_wall_s": time.perf_counter() - t0,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        **stats,
    }


def _turn_prefixes(conversations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One training text per assistant turn: the conversation up to and including it, so
    the target learns both reasoning-kept (last turn) and reasoning-dropped (past) forms."""
    out = []
    for c in conversations:
        msgs = c["messages"]
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                out.append({"messages": msgs[: i + 1]})
    return out
