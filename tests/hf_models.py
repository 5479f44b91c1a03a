"""Tiny random-init transformers models (BERT, GPT-2) from their configs, as the README's
recipe builds them: factories for `xbackend export torch` and `--torch-module`."""

from __future__ import annotations

from typing import Any

import torch
import transformers


class LastHidden(torch.nn.Module):
    """A transformers model's last hidden state as one plain tensor (no cache, no output dict)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **extra)
        return out.last_hidden_state


def bert() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    return LastHidden(transformers.AutoModel.from_config(cfg)).eval()


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return LastHidden(transformers.AutoModel.from_config(cfg)).eval()
