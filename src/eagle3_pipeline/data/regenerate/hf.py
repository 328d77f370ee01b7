"""The ``hf`` regeneration backend: the target loaded in-process, batched greedy ``generate``.

Why left padding and sorting by prompt length: every prompt of a batch must end at the
same column for ``generate`` to append after it, and similar lengths waste the least
padding; each result is handed back with its request's index.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_pipeline.data.regenerate.turns import Generation, OnResult, Request


class HFBackend:
    """Batched greedy generation with the target loaded in-process (CPU or GPU)."""

    name = "hf"

    def __init__(
        self,
        model_dir: str | Path,
        eot_ids: list[int],
        pad_id: int,
        max_new_tokens: int,
        batch_size: int,
        device: str = "cpu",
        dtype: str = "float32",
        model: Any = None,
    ) -> None:
        from eagle3_pipeline.targets.tiny import load_target_model

        self.model_dir = Path(model_dir)
        self.eot_ids = list(eot_ids)
        self.pad_id = pad_id
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.device = device
        self.model = model if model is not None else load_target_model(self.model_dir, dtype)
        self.model.to(device)

    def fingerprint(self) -> dict[str, Any]:
        """The generation settings (the target's content is added by the caller)."""
        return {
            "backend": self.name,
            "max_new_tokens": self.max_new_tokens,
            "eot": self.eot_ids,
            "device": self.device,
            "dtype": str(next(self.model.parameters()).dtype),
        }

    def generate(self, requests: list[Request], on_result: OnResult) -> None:
        import torch

        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            prompts = [requests[i].prompt_ids for i in batch]
            width = max(len(p) for p in prompts)
            ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for k, p in enumerate(prompts):  # left padding: every prompt ends at `width`
                ids[k, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[k, width - len(p) :] = 1
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    eos_token_id=self.eot_ids,
                    pad_token_id=self.pad_id,
                )
            for k, i in enumerate(batch):
                gen = out[k, width:].tolist()
                end = next((n for n, t in enumerate(gen) if t in self.eot_ids), None)
                on_result(i, Generation(list(prompts[k]), gen if end is None else gen[: end + 1]))
