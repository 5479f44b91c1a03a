"""Linear, SiLU, x3, GELU, LayerNorm in half precision. Fused, Inductor keeps the chain from the
Linear's output to the LayerNorm in float32 registers. Compiled to also return the GELU output,
it stores that rounded to half and normalizes the rounded values (in the same kernel), so the
instrumented compile's outputs differ from the plain one's."""

from __future__ import annotations

import torch
from torch import nn


class HalfChain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.act = nn.SiLU()
        self.act2 = nn.GELU()
        self.ln = nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.act2(self.act(self.fc(x)) * 3.0))


def build() -> nn.Module:
    """float16, seeded: the same module every time."""
    torch.manual_seed(0)
    return HalfChain().eval().half()


def build_bf16() -> nn.Module:
    torch.manual_seed(0)
    return HalfChain().eval().to(torch.bfloat16)
