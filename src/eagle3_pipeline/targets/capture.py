"""Capturing the target's hidden states during a forward of its language model.

Forward pre-hooks see exactly what a module receives, so the state entering decoder
layer k and the state entering the final norm are captured without relying on
``output_hidden_states`` (whose last entry is after the norm in transformers 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from eagle3_pipeline.core.errors import StageError
from eagle3_pipeline.targets.loading import LanguageModel


class Capture:
    """Forward pre-hooks: the input of decoder layer k is the residual stream entering it
    (aux id k); the input of the final norm is the final hidden state before the norm."""

    def __init__(self, lm: LanguageModel, aux_layer_ids: Sequence[int]) -> None:
        self.n = len(aux_layer_ids) + 1
        self.store: dict[int, Any] = {}
        self._handles = [
            lm.layers[k].register_forward_pre_hook(partial(self._hook, pos), with_kwargs=True)
            for pos, k in enumerate(aux_layer_ids)
        ]
        self._handles.append(
            lm.norm.register_forward_pre_hook(partial(self._hook, self.n - 1), with_kwargs=True)
        )

    def _hook(self, pos: int, _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.store[pos] = args[0] if args else kwargs["hidden_states"]

    def take(self) -> Any:
        """``[batch, seq, n_aux + 1, hidden]`` of the last forward."""
        import torch

        missing = [p for p in range(self.n) if p not in self.store]
        if missing:
            raise StageError(f"capture hooks did not fire for positions {missing}")
        out = torch.stack(
            [self.store[p].to(self.store[self.n - 1].device) for p in range(self.n)], 2
        )
        self.store.clear()
        return out

    def clear(self) -> None:
        """Drop the last forward's states unread (a forward whose states nobody needs)."""
        self.store.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def forward_batch(lm: LanguageModel, seqs: Sequence[Any], pad_id: int) -> tuple[Any, Any]:
    """Right-padded forward of the decoder (no lm_head: extraction never needs logits).
    Right padding leaves every real token's causal context, positions and so its hidden
    states unchanged."""
    import torch

    longest = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), longest), dtype=torch.long)
    for b, s in enumerate(seqs):
        # a row read from the prepared dataset is a read-only numpy view: copy, no warning
        ids[b, : len(s)] = torch.as_tensor(s.copy() if hasattr(s, "copy") else s)
        mask[b, : len(s)] = 1
    out = lm.decoder(
        input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device), use_cache=False
    )
    return out.last_hidden_state, ids


def check_capture(lm: LanguageModel, hs: Any, last: Any) -> None:
    """The captured final state must be what the final norm received: norm(captured) ==
    the decoder's output. Catches a hook on the wrong module before any file is written."""
    import torch

    normed = lm.norm(hs[:, :, -1].to(last.dtype))
    if not torch.allclose(normed.float(), last.float(), rtol=1e-3, atol=1e-3):
        raise StageError(
            "the captured final hidden state does not reproduce the final norm's output"
        )


def pad_id(model: Any) -> int:
    """The id right padding uses (any id works: padded positions are masked and dropped)."""
    pad = getattr(model.config, "pad_token_id", None)
    if isinstance(pad, int) and pad >= 0:
        return pad
    return 0
