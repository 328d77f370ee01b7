"""The embedded default target: a tiny member of a target family, built and trained here.

Why build instead of download: nothing can be fetched from a model hub here, and a
newcomer's first ``dvc repro`` must run end to end on a laptop CPU. The tiny target is a
real transformers model of the real architecture (``model.tiny.architecture`` names a
family in :mod:`eagle3_pipeline.targets.families`; the default ``kimi_k25`` is a nested
``text_config``, DeepSeek-V3 MLA + MoE language model and a vision tower), saved in the
real checkpoint's layout, so the pipeline's nested-target code is exercised, not bypassed.
Every tiny target shares one tokenizer and Kimi-K2.5's chat format; the family decides
the model.

Why train it: an untrained target produces noise, and a draft trained on noise says
nothing about acceptance. A few hundred steps on the built-in corpus make its greedy
continuations language-like; its held-out perplexity is recorded against a unigram
baseline of the same split.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.core.config import (
    TargetStageConfig,
    TinyModelConfig,
    check_tiny_architecture,
)
from eagle3_pipeline.targets.families import family_for_config, get_family
from eagle3_pipeline.targets.families.base import tiny_common_config
from eagle3_pipeline.targets.families.kimi_k25 import CHAT_TEMPLATE, CHAT_TOKENS, END_OF_TURN
from eagle3_pipeline.targets.families.kimi_k25 import (
    REASONING_MARKERS as REASONING_MARKERS,  # readers of the tiny chat format import it here
)

log = logging.getLogger(__name__)

# The tiny tokenizer's own begin / end / padding tokens, then Kimi-K2.5's chat tokens.
BOS, EOS, PAD = "[BOS]", "[EOS]", "[PAD]"
SPECIAL_TOKENS = [BOS, EOS, PAD, *CHAT_TOKENS]


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
        eos_token=END_OF_TURN,
        pad_token=PAD,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (BOS, END_OF_TURN, PAD)],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
    )
    return hf


# --------------------------------------------------------------------------- models


def build_model(shape: TinyModelConfig, tokenizer: Any, seed: int) -> Any:
    """Instantiate the tiny target of ``shape.architecture`` with random weights (seeded)."""
    import torch

    check_tiny_architecture(shape.architecture)
    builder = get_family(shape.architecture).tiny
    assert builder is not None
    torch.manual_seed(seed)
    ids = tokenizer.convert_tokens_to_ids
    common = {
        **tiny_common_config(shape),
        "vocab_size": len(tokenizer),
        "bos_token_id": ids(BOS),
        "eos_token_id": ids(END_OF_TURN),
        "pad_token_id": ids(PAD),
    }
    return builder.build(shape, common, tokenizer)


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


@dataclass(frozen=True)
class TinyTraining:
    """What :func:`train_model` measured."""

    final_train_loss: float  # at its last training step
    train_wall_s: float  # the training loop
    train_steps: int  # target.train_steps


@dataclass(frozen=True)
class TinyTarget:
    """What building the tiny target measured: the target record's tiny figures
    (:class:`~eagle3_pipeline.targets.record.TargetRecord`, field by field)."""

    parameters: int  # its parameter count
    train_tokens: int  # tokens of its training corpus
    heldout_tokens: int  # tokens of its held-out corpus
    heldout_perplexity: float  # after training
    heldout_perplexity_untrained: float  # before training
    unigram_perplexity: float  # a unigram model's on the same tokens
    perplexity_ratio_vs_unigram: float  # < 1: it learned the corpus
    reload_logits_identical: bool  # the saved checkpoint reloads exactly
    build_wall_s: float  # building it, end to end
    threads: int  # torch's intra-op threads
    cpu_count: int | None  # the machine's cores (None: unknown)
    training: TinyTraining  # its training loop's


def train_model(
    model: Any,
    train_ids: list[int],
    settings: TargetStageConfig,
    seed: int,
    progress: bool = True,
) -> TinyTraining:
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
    return TinyTraining(
        final_train_loss=loss_val, train_wall_s=wall, train_steps=settings.train_steps
    )


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


def unigram_perplexity(
    train_ids: list[int], eval_ids: list[int], vocab: int, seq_len: int
) -> float:
    """Perplexity of an add-one unigram model fit on the train split, scored on exactly
    the tokens :func:`perplexity` scores (same chunks, first token of each unscored)."""
    counts = Counter(train_ids)
    total = len(train_ids) + vocab
    n = len(eval_ids) // seq_len
    scored = [t for c in range(n) for t in eval_ids[c * seq_len + 1 : (c + 1) * seq_len]]
    nll = -sum(math.log((counts.get(t, 0) + 1) / total) for t in scored)
    return math.exp(nll / max(1, len(scored)))


# --------------------------------------------------------------------------- saving


def save_target(model: Any, tokenizer: Any, out_dir: Path, max_shard_size: str) -> None:
    """save_pretrained, then the family's fix-ups into the real checkpoint layout."""
    from transformers import GenerationConfig

    model.save_pretrained(out_dir, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(out_dir)
    eos = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    GenerationConfig(
        eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, do_sample=False
    ).save_pretrained(out_dir)
    builder = family_for_config({"model_type": model.config.model_type}).tiny
    if builder is not None:
        builder.finalize(out_dir)


def load_target_model(model_dir: Path, dtype: str = "float32") -> Any:
    import torch
    import transformers
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    auto_class = family_for_config({"model_type": cfg.model_type}).auto_class
    cls = getattr(transformers, auto_class)
    return cls.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()


def build_tiny_target(
    shape: TinyModelConfig,
    settings: TargetStageConfig,
    out_dir: Path,
    seed: int,
    progress: bool = True,
) -> TinyTarget:
    """Build, train and save the tiny target into ``out_dir``; return its figures."""
    import torch

    from eagle3_pipeline.core.corpus import builtin_conversations

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
    log.info(
        "tokenizer: %d tokens; corpus: %d train / %d held-out tokens",
        len(tokenizer),
        len(train_ids),
        len(held_ids),
    )

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
        same = torch.equal(
            language_model_forward(model, probe), language_model_forward(reloaded, probe)
        )
    if not same:
        raise RuntimeError(f"{out_dir}: reloaded target gives different logits")
    return TinyTarget(
        parameters=n_params,
        train_tokens=len(train_ids),
        heldout_tokens=len(held_ids),
        heldout_perplexity=ppl,
        heldout_perplexity_untrained=ppl_untrained,
        unigram_perplexity=ppl_unigram,
        perplexity_ratio_vs_unigram=ppl / ppl_unigram,
        reload_logits_identical=same,
        build_wall_s=time.perf_counter() - t0,
        threads=torch.get_num_threads(),
        cpu_count=os.cpu_count(),
        training=stats,
    )


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
